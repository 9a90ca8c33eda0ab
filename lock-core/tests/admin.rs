//! [`LockAdmin`] on the in-process store: what `list` shows, and what a forced release does
//! to the holder, the fence and the next holder.

use std::time::Duration;

use lock_core::{LockAdmin, LockClient, LockName, LockOptions, LossReason, MemoryBackend};

#[tokio::test]
async fn list_and_force_release() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let options = LockOptions::new().ttl(Duration::from_millis(600));
    let held = client.lock_with("jobs/a", &options).await.unwrap();
    let other = client.lock_with("other/b", &options).await.unwrap();

    let listed = backend.list("jobs/").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name.as_str(), "jobs/a");
    assert_eq!(listed[0].fence, held.fence());
    assert_eq!(listed[0].holder, held.lease().token().fingerprint());
    assert_ne!(listed[0].holder, held.lease().token().as_str());
    assert_eq!(backend.list("").await.unwrap().len(), 2);

    let name = LockName::new("jobs/a").unwrap();
    let forced = backend.force_release(&name).await.unwrap().unwrap();
    assert_eq!(forced.evicted.fence, held.fence());
    assert!(forced.fence_floor > held.fence());
    assert!(backend.list("jobs/").await.unwrap().is_empty());
    assert!(backend.force_release(&name).await.unwrap().is_none());

    // The holder learns at its next renewal; the next holder's fence is above the floor.
    assert_eq!(held.lost().await, LossReason::NotHeld);
    let next = client.lock_with("jobs/a", &options).await.unwrap();
    assert!(next.fence() > forced.fence_floor);
    next.release().await.unwrap();
    other.release().await.unwrap();
}
