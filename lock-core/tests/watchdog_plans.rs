//! The watchdog wakes for a hold that falls due before its planned wake-up: a client skips
//! waking it when a new hold falls due no sooner than the watchdog wakes anyway, and must not
//! skip it when the new hold falls due first (the case here; the skip itself is measured, not
//! tested: the lock-core commit that made it counted context switches).

use std::time::Duration;

use lock_core::{LockClient, LockName, LockOptions, MemoryBackend};

#[allow(clippy::unwrap_used)] // test set-up
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_short_hold_taken_while_the_watchdog_sleeps_toward_a_long_one_is_renewed() {
    let client = LockClient::new(MemoryBackend::new());
    runtime().block_on(async {
        let long = client
            .lock_with(
                &LockName::new("long").unwrap(),
                &LockOptions::new().ttl(Duration::from_secs(30)),
            )
            .await
            .unwrap();
        // On this one-thread runtime the watchdog task runs when the test yields: it plans the
        // long hold's renewal (10 s away) and sleeps toward it.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let short = client
            .lock_with(
                &LockName::new("short").unwrap(),
                &LockOptions::new().ttl(Duration::from_secs(1)),
            )
            .await
            .unwrap();
        // Two and a half of the short hold's TTLs: held only if the watchdog renewed it (at
        // a third of its TTL; a stall of up to about 650 ms still finds it renewed in time).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(
            short.is_held(),
            "the 1 s hold taken while the watchdog slept toward the 30 s one was not renewed"
        );
        assert!(long.is_held(), "the 30 s hold was lost");
        short.release().await.unwrap();
        long.release().await.unwrap();
    });
}
