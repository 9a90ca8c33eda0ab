//! The watchdog retries a failing renewal at a measured pace until the local deadline, then
//! reports the loss; it never spins.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use lock_core::{
    AcquireRequest, Capabilities, Grant, Holder, Lease, LockBackend, LockClient, LockError,
    LockInfo, LockName, LockOptions, LossReason, MemoryBackend, async_trait,
};

/// Grants through a MemoryBackend but never manages to renew.
#[derive(Debug, Default)]
struct Unrenewable {
    inner: MemoryBackend,
    renewals: Arc<AtomicUsize>,
}

#[async_trait]
impl LockBackend for Unrenewable {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.inner.acquire(request).await
    }
    async fn renew(&self, _lease: &Lease, _ttl: Duration) -> Result<Grant, LockError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        Err(LockError::Unavailable {
            message: "store unreachable".into(),
            source: None,
        })
    }
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(name).await
    }
}

#[tokio::test]
async fn failed_renewals_back_off_until_the_deadline() {
    let backend = Unrenewable::default();
    let renewals = backend.renewals.clone();
    let client = LockClient::new(backend);
    let name = LockName::new("flaky").unwrap();
    let options = LockOptions::new().ttl(Duration::from_millis(300));
    let guard = client
        .acquire(&Holder::new(), &name, &options)
        .await
        .unwrap();
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
