//! Dropping a guard where no Tokio runtime exists never panics; the lease then ends at its TTL.

use std::time::Duration;

use lock_core::{LockClient, LockName, LockOptions, MemoryBackend};

#[test]
fn dropping_a_guard_outside_any_runtime_does_not_panic() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let name = LockName::new("outside").unwrap();
    let options = LockOptions::new().ttl(Duration::from_millis(200));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = runtime.block_on(client.lock_with(&name, &options)).unwrap();
    drop(runtime);
    // No runtime on this thread now: the drop must neither panic nor block.
    drop(guard);
    // The store still has the lease (nobody could release it); it ends at its TTL.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert!(client.inspect(&name).await.unwrap().is_some());
        let wait = options.clone().wait(Duration::from_secs(2));
        let next = client.lock_with(&name, &wait).await.unwrap();
        next.release().await.unwrap();
    });
}
