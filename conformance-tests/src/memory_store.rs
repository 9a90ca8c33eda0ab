//! [`MemoryStore`]: the [`TestStore`] of the in-memory reference backend, with a simulated
//! outage.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use lock_core::{
    Capabilities, Lease, LockAdmin, LockBackend, LockClient, LockError, LockInfo, LockName,
    MemoryBackend,
    backend::{AcquireRequest, Grant},
};

use crate::TestStore;

/// The [`TestStore`] of the in-memory reference backend. Its outage is simulated: while it
/// lasts, every call of every client answers [`LockError::Unavailable`].
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    backend: MemoryBackend,
    down: Arc<AtomicBool>,
}

impl MemoryStore {
    /// A store over a fresh [`MemoryBackend`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The backend shared by every client of this store.
    pub fn backend(&self) -> &MemoryBackend {
        &self.backend
    }

    /// The switch of the simulated outage (true while the store is down).
    pub fn outage_switch(&self) -> Arc<AtomicBool> {
        self.down.clone()
    }
}

/// The answer of an unreachable in-process store.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unreachable;

impl Unreachable {
    /// The error every call gets while the store is down.
    pub fn error() -> LockError {
        LockError::unavailable_msg("the in-memory store is down (simulated outage)")
    }
}

/// A [`MemoryBackend`] that answers [`Unreachable::error`] while its switch is on.
#[derive(Debug)]
struct Switched {
    inner: MemoryBackend,
    down: Arc<AtomicBool>,
}

impl Switched {
    fn up(&self) -> Result<(), LockError> {
        if self.down.load(Ordering::SeqCst) {
            Err(Unreachable::error())
        } else {
            Ok(())
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LockBackend for Switched {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn store(&self) -> &'static str {
        self.inner.store()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.up()?;
        self.inner.acquire(request).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        self.up()?;
        self.inner.renew(lease, ttl).await
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Unreachable::error());
        }
        self.inner.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.up()?;
        self.inner.release(lease).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.up()?;
        self.inner.inspect(name).await
    }
}

#[async_trait]
impl TestStore for MemoryStore {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(Switched {
            inner: self.backend.clone(),
            down: self.down.clone(),
        }))
    }

    async fn begin_outage(&self) -> Result<(), LockError> {
        self.down.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn end_outage(&self) -> Result<(), LockError> {
        self.down.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn can_fail(&self) -> Result<(), &'static str> {
        Ok(())
    }

    async fn revoke(&self, name: &LockName) -> Result<(), LockError> {
        self.backend.evict(name);
        Ok(())
    }

    fn url(&self) -> String {
        "memory://".into()
    }

    async fn admin(&self) -> Result<Arc<dyn LockAdmin>, LockError> {
        Ok(Arc::new(self.backend.clone()))
    }

    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError> {
        let client = self.client().await?;
        Ok(client
            .inspect(name)
            .await?
            .map(|info| vec![format!("a live lease with fence {}", info.fence)])
            .unwrap_or_default())
    }

    fn cross_process(&self) -> bool {
        false
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(300)
    }
}
