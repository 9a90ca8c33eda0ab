//! [`DelayingBackend`]: a transparent wrapper that holds chosen requests back before they reach
//! the store, so scenarios can act while a renewal or a release is in flight (as a slow pool
//! checkout or a congested connection would), on any backend.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use lock_core::{
    Capabilities, Lease, LockBackend, LockError, LockInfo, LockName,
    backend::{AcquireRequest, Grant},
};
use tokio::sync::Notify;

/// Which requests are held back, and for how long.
#[derive(Debug, Clone, Copy, Default)]
struct Delays {
    /// Renewals asking for exactly this TTL, and the delay.
    renew: Option<(Duration, Duration)>,
    /// Every release, before it reaches the store.
    release: Option<Duration>,
    /// Every release's answer, after the store applied it.
    release_reply: Option<Duration>,
}

/// Forwards every call to the wrapped backend; renewals of one chosen TTL and releases can be
/// held back for a while first. A delayed renewal reports the instant it was *called* as its
/// `valid_from` (what a backend sees when its request waits in a queue before the wire).
#[derive(Debug)]
pub struct DelayingBackend {
    inner: Arc<dyn LockBackend>,
    delays: Mutex<Delays>,
    started: Notify,
}

impl DelayingBackend {
    /// Wraps `inner`, delaying nothing yet.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        Self {
            inner,
            delays: Mutex::new(Delays::default()),
            started: Notify::new(),
        }
    }

    fn delays(&self) -> Delays {
        *self.delays.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds renewals that ask for `ttl` back for `delay` before they reach the store.
    pub fn delay_renewals_of(&self, ttl: Duration, delay: Duration) {
        self.delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .renew = Some((ttl, delay));
    }

    /// Holds every release back for `delay` before it reaches the store.
    pub fn delay_releases(&self, delay: Duration) {
        self.delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release = Some(delay);
    }

    /// Holds the answer of every release back for `delay` after the store applied it.
    pub fn delay_release_replies(&self, delay: Duration) {
        self.delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release_reply = Some(delay);
    }

    /// Resolves when a delayed request has started (it is then in flight).
    pub async fn delayed_started(&self) {
        self.started.notified().await;
    }

    async fn hold_back(&self, delay: Duration) {
        self.started.notify_waiters();
        tokio::time::sleep(delay).await;
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LockBackend for DelayingBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn store(&self) -> &'static str {
        self.inner.store()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.inner.acquire(request).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        match self.delays().renew {
            Some((slow, delay)) if slow == ttl => {
                let sent = Instant::now();
                self.hold_back(delay).await;
                let grant = self.inner.renew(lease, ttl).await?;
                Ok(Grant::new(grant.lease, sent))
            }
            _ => self.inner.renew(lease, ttl).await,
        }
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let slow = self
            .delays()
            .renew
            .filter(|(ttl, _)| leases.iter().any(|lease| lease.ttl() == *ttl));
        match slow {
            Some((_, delay)) => {
                let sent = Instant::now();
                self.hold_back(delay).await;
                Ok(self
                    .inner
                    .renew_many(leases)
                    .await?
                    .into_iter()
                    .map(|result| result.map(|grant| Grant::new(grant.lease, sent)))
                    .collect())
            }
            None => self.inner.renew_many(leases).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let delays = self.delays();
        if let Some(delay) = delays.release {
            self.hold_back(delay).await;
        }
        let result = self.inner.release(lease).await;
        if let Some(delay) = delays.release_reply {
            self.hold_back(delay).await;
        }
        result
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(name).await
    }
}
