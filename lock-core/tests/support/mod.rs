//! The test backend of lock-core's integration tests: the [`MemoryBackend`] with the behaviour
//! a test breaks replaced, so each test states only the fault it injects.

use std::{fmt, time::Duration};

use lock_core::{
    Capabilities, Lease, LockBackend, LockError, LockInfo, LockName, MemoryBackend,
    backend::{AcquireRequest, Grant, async_trait},
};

/// What a test replaces; every method defaults to the memory store's own.
#[async_trait]
pub(crate) trait Fault: Send + Sync + fmt::Debug + 'static {
    async fn acquire(
        &self,
        store: &MemoryBackend,
        request: &AcquireRequest,
    ) -> Result<Grant, LockError> {
        store.acquire(request).await
    }

    async fn renew(
        &self,
        store: &MemoryBackend,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Grant, LockError> {
        store.renew(lease, ttl).await
    }

    /// One by one through [`Fault::renew`], so a replaced `renew` applies to batches too.
    async fn renew_many(
        &self,
        store: &MemoryBackend,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            out.push(self.renew(store, lease, lease.ttl()).await);
        }
        Ok(out)
    }

    async fn release(&self, store: &MemoryBackend, lease: &Lease) -> Result<(), LockError> {
        store.release(lease).await
    }
}

/// The memory store with `F`'s replacements.
#[derive(Debug, Default)]
pub(crate) struct Faulty<F> {
    pub(crate) store: MemoryBackend,
    pub(crate) fault: F,
}

impl<F> Faulty<F> {
    #[allow(dead_code)] // not every test file builds its backend from a value
    pub(crate) fn new(fault: F) -> Self {
        Self {
            store: MemoryBackend::new(),
            fault,
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<F: Fault> LockBackend for Faulty<F> {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    fn store(&self) -> &'static str {
        self.store.store()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.fault.acquire(&self.store, request).await
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        self.fault.renew(&self.store, lease, ttl).await
    }
    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        self.fault.renew_many(&self.store, leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.fault.release(&self.store, lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.store.inspect(name).await
    }
}
