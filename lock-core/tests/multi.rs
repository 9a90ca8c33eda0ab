//! `acquire_all`: all or nothing within one wait budget, released when it fails or its future
//! is dropped, one loss signal, and bad input refused with nothing taken.

use std::time::{Duration, Instant};

use lock_core::{Holder, LockClient, LockError, LockName, LockOptions, LossReason, MemoryBackend};

fn options(wait: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(600))
        .wait(wait)
}

#[tokio::test]
async fn all_or_nothing_within_one_budget() {
    let client = LockClient::new(MemoryBackend::new());
    let blocker = client.lock("set/c").await.unwrap();
    let budget = Duration::from_millis(200);
    let start = Instant::now();
    let failed = client
        .acquire_all(
            &Holder::new(),
            ["set/a", "set/b", "set/c"],
            &options(budget),
        )
        .await;
    assert!(
        matches!(failed, Err(LockError::Timeout { .. })),
        "{failed:?}"
    );
    // One budget for the set, not one per name.
    assert!(start.elapsed() < budget * 2, "{:?}", start.elapsed());
    // What it took was given back before the error came.
    for name in ["set/a", "set/b"] {
        assert!(
            client.inspect(name).await.unwrap().is_none(),
            "{name} stayed held"
        );
    }
    blocker.release().await.unwrap();
    let all = client
        .acquire_all(
            &Holder::new(),
            ["set/a", "set/b", "set/c"],
            &options(budget),
        )
        .await
        .unwrap();
    assert!(all.is_held());
    let a = LockName::new("set/a").unwrap();
    assert_eq!(all.fence(&a), Some(all.guards()[0].fence()));
    all.release().await.unwrap();
    for name in ["set/a", "set/b", "set/c"] {
        assert!(
            client.inspect(name).await.unwrap().is_none(),
            "{name} stayed held"
        );
    }
}

#[tokio::test]
async fn a_dropped_acquisition_gives_back_what_it_took() {
    let client = LockClient::new(MemoryBackend::new());
    let blocker = client.lock("drop/b").await.unwrap();
    let pending = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .acquire_all(
                    &Holder::new(),
                    ["drop/a", "drop/b"],
                    &options(Duration::from_secs(30)),
                )
                .await
        })
    };
    // Wait until it holds the first and waits for the second.
    while client.inspect("drop/a").await.unwrap().is_none() {
        tokio::task::yield_now().await;
    }
    pending.abort();
    assert!(pending.await.unwrap_err().is_cancelled());
    let freed = client
        .lock_with("drop/a", &options(Duration::from_secs(5)))
        .await
        .unwrap();
    freed.release().await.unwrap();
    blocker.release().await.unwrap();
}

#[tokio::test]
async fn one_loss_signal_for_the_set() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let all = client
        .acquire_all(
            &Holder::new(),
            ["lost/a", "lost/b"],
            &options(Duration::ZERO),
        )
        .await
        .unwrap();
    assert!(backend.evict(&LockName::new("lost/b").unwrap()));
    assert_eq!(all.lost().await, LossReason::NotHeld);
    assert!(!all.is_held());
}

#[tokio::test]
async fn bad_input_takes_nothing() {
    let client = LockClient::new(MemoryBackend::new());
    let none: [&str; 0] = [];
    for result in [
        client
            .acquire_all(&Holder::new(), none, &options(Duration::ZERO))
            .await,
        client
            .acquire_all(&Holder::new(), ["x/a", "x/a"], &options(Duration::ZERO))
            .await,
        client
            .acquire_all(&Holder::new(), ["x/a", ""], &options(Duration::ZERO))
            .await,
    ] {
        assert!(
            matches!(
                result,
                Err(LockError::InvalidOptions { .. } | LockError::InvalidName { .. })
            ),
            "{result:?}"
        );
    }
    assert!(client.inspect("x/a").await.unwrap().is_none());
}
