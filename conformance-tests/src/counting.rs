//! [`CountingBackend`]: a transparent wrapper that counts calls, so scenarios can observe what
//! the watchdog does (batching, stopping) on any backend.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use lock_core::{
    AcquireRequest, Capabilities, Grant, Lease, LockBackend, LockError, LockInfo, LockName,
};
use tokio::sync::watch;

/// Forwards every call to the wrapped backend and counts renewals.
#[derive(Debug)]
pub struct CountingBackend {
    inner: Arc<dyn LockBackend>,
    renew_calls: AtomicUsize,
    renew_many_calls: AtomicUsize,
    renewed: watch::Sender<usize>,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Calls of `renew` (one lease each).
    pub renew_calls: usize,
    /// Calls of `renew_many` (a batch each).
    pub renew_many_calls: usize,
    /// Leases renewed successfully, by either method.
    pub renewed: usize,
}

impl CountingBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        Self {
            inner,
            renew_calls: AtomicUsize::new(0),
            renew_many_calls: AtomicUsize::new(0),
            renewed: watch::channel(0).0,
        }
    }

    /// The counters now.
    pub fn counts(&self) -> Counts {
        Counts {
            renew_calls: self.renew_calls.load(Ordering::SeqCst),
            renew_many_calls: self.renew_many_calls.load(Ordering::SeqCst),
            renewed: *self.renewed.borrow(),
        }
    }

    /// Waits until at least `n` leases were renewed, up to `limit`; false on time-out.
    pub async fn wait_renewed(&self, n: usize, limit: Duration) -> bool {
        let mut rx = self.renewed.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|count| *count >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn add_renewed(&self, n: usize) {
        self.renewed.send_modify(|count| *count += n);
    }
}

#[async_trait]
impl LockBackend for CountingBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.inner.acquire(request).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        let result = self.inner.renew(lease, ttl).await;
        if result.is_ok() {
            self.add_renewed(1);
        }
        result
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Grant, LockError>> {
        self.renew_many_calls.fetch_add(1, Ordering::SeqCst);
        let results = self.inner.renew_many(leases).await;
        self.add_renewed(results.iter().filter(|r| r.is_ok()).count());
        results
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(name).await
    }
}
