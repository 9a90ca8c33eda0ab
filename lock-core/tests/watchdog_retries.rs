//! The watchdog retries a failing renewal at a measured pace until the local deadline, then
//! reports the loss; it never spins.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use lock_core::{
    Lease, LockClient, LockError, LockName, LockOptions, LossReason, MemoryBackend,
    backend::{Grant, async_trait},
};
use support::{Fault, Faulty};

/// Grants through the memory store but never manages to renew.
#[derive(Debug, Default)]
struct Unrenewable {
    renewals: Arc<AtomicUsize>,
}

#[async_trait]
impl Fault for Unrenewable {
    async fn renew(
        &self,
        _store: &MemoryBackend,
        _lease: &Lease,
        _ttl: Duration,
    ) -> Result<Grant, LockError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        Err(LockError::unavailable_msg("store unreachable"))
    }
}

#[tokio::test]
async fn failed_renewals_back_off_until_the_deadline() {
    let backend = Faulty::<Unrenewable>::default();
    let renewals = backend.fault.renewals.clone();
    let client = LockClient::new(backend);
    let name = LockName::new("flaky").unwrap();
    let options = LockOptions::new().ttl(Duration::from_millis(300));
    let guard = client.lock_with(&name, &options).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() fires at the local deadline");
    assert_eq!(reason, LossReason::Expired);
    let calls = renewals.load(Ordering::SeqCst);
    // Renewal every 100 ms, retries every 25 ms after a failure: a handful before 300 ms.
    assert!(calls >= 2, "the watchdog did not retry: {calls} renewals");
    assert!(
        calls <= 20,
        "the watchdog spun: {calls} renewals in one TTL"
    );
    assert!(!guard.is_held());
}
