//! A backend's end signal makes the hold lost the moment the store ends it: `is_held()` turns
//! false at once and `lost()` resolves with the reason, without waiting for a renewal.

mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use lock_core::{
    LockBackend, LockClient, LockError, LockName, LockOptions, LossReason, MemoryBackend,
    backend::{AcquireRequest, EndNotifier, Grant, async_trait, end_signal},
};
use support::{Fault, Faulty};

/// Grants through the memory store and keeps the notifier of each grant's end signal.
#[derive(Debug, Default)]
struct Ending {
    notifiers: Arc<Mutex<Vec<EndNotifier>>>,
}

#[async_trait]
impl Fault for Ending {
    async fn acquire(
        &self,
        store: &MemoryBackend,
        request: &AcquireRequest,
    ) -> Result<Grant, LockError> {
        let grant = store.acquire(request).await?;
        let (notifier, signal) = end_signal();
        self.notifiers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(notifier);
        Ok(grant.with_end(signal))
    }
}

#[tokio::test]
async fn the_store_ending_a_hold_is_seen_at_once() {
    let backend = Faulty::<Ending>::default();
    let notifiers = backend.fault.notifiers.clone();
    let client = LockClient::new(backend);
    let name = LockName::new("ending").unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = client.lock_with(&name, &options).await.unwrap();
    let lost = tokio::spawn(guard.lost());
    assert!(guard.is_held());
    notifiers.lock().unwrap()[0].end(LossReason::SessionEnded);
    assert!(!guard.is_held(), "is_held() after the store ended the hold");
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost() resolves when the store ends the hold")
        .unwrap();
    assert_eq!(reason, LossReason::SessionEnded);
    assert!(matches!(
        guard.release().await,
        Err(LockError::Lost {
            reason: LossReason::SessionEnded,
            ..
        })
    ));
}

#[tokio::test]
async fn a_notifier_dropped_without_ending_changes_nothing() {
    let backend = Faulty::<Ending>::default();
    let notifiers = backend.fault.notifiers.clone();
    let client = LockClient::new(backend);
    let name = LockName::new("not-ending").unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = client.lock_with(&name, &options).await.unwrap();
    let lost = guard.lost();
    notifiers.lock().unwrap().clear();
    assert!(guard.is_held());
    assert!(
        tokio::time::timeout(Duration::from_millis(50), lost)
            .await
            .is_err(),
        "lost() resolved though the store did not end the hold"
    );
    guard.release().await.unwrap();
    assert!(notifiers.lock().unwrap().is_empty());
}
