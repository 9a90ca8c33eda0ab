//! [`Counting`]: a transparent layer that counts the calls reaching the store.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    Capabilities, Lease, LockError, LockInfo, LockName,
    backend::{AcquireRequest, Grant, LockBackend, async_trait},
};

/// Forwards every call to the wrapped backend and counts them, so a test or a benchmark can
/// see what the watchdog and the client send (batching, stopping, retries).
///
/// ```
/// use std::sync::Arc;
/// use lock_core::{LockClient, MemoryBackend, layer::Counting};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let counting = Arc::new(Counting::new(MemoryBackend::new()));
/// let client = LockClient::new(counting.clone());
/// client.lock("jobs/1").await?.release().await?;
/// let counts = counting.counts();
/// assert_eq!((counts.acquire_calls, counts.release_calls), (1, 1));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Counting<B> {
    inner: B,
    acquire_calls: AtomicUsize,
    renew_calls: AtomicUsize,
    renew_many_calls: AtomicUsize,
    release_calls: AtomicUsize,
    inspect_calls: AtomicUsize,
    renewed: watch::Sender<usize>,
}

/// A snapshot of the counters of a [`Counting`] layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Calls of `acquire`.
    pub acquire_calls: usize,
    /// Calls of `renew` (one lease each).
    pub renew_calls: usize,
    /// Calls of `renew_many` (a batch each).
    pub renew_many_calls: usize,
    /// Calls of `release`.
    pub release_calls: usize,
    /// Calls of `inspect`.
    pub inspect_calls: usize,
    /// Leases renewed successfully, by either method.
    pub renewed: usize,
}

impl<B: LockBackend> Counting<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            acquire_calls: AtomicUsize::new(0),
            renew_calls: AtomicUsize::new(0),
            renew_many_calls: AtomicUsize::new(0),
            release_calls: AtomicUsize::new(0),
            inspect_calls: AtomicUsize::new(0),
            renewed: watch::channel(0).0,
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The counters now.
    pub fn counts(&self) -> Counts {
        Counts {
            acquire_calls: self.acquire_calls.load(Ordering::SeqCst),
            renew_calls: self.renew_calls.load(Ordering::SeqCst),
            renew_many_calls: self.renew_many_calls.load(Ordering::SeqCst),
            release_calls: self.release_calls.load(Ordering::SeqCst),
            inspect_calls: self.inspect_calls.load(Ordering::SeqCst),
            renewed: *self.renewed.borrow(),
        }
    }

    /// Waits until at least `n` leases were renewed, up to `limit`; false on time-out.
    ///
    /// # Cancel safety
    /// A wait: dropping the future changes nothing.
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
#[deny(clippy::missing_trait_methods)]
impl<B: LockBackend> LockBackend for Counting<B> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn store(&self) -> &'static str {
        self.inner.store()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.acquire_calls.fetch_add(1, Ordering::SeqCst);
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

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        self.renew_many_calls.fetch_add(1, Ordering::SeqCst);
        let results = self.inner.renew_many(leases).await;
        if let Ok(results) = &results {
            self.add_renewed(results.iter().filter(|r| r.is_ok()).count());
        }
        results
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.release_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.release(lease).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.inspect_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.inspect(name).await
    }
}
