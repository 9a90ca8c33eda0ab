//! [`LockBackend`]: the small trait every store implements, and [`AcquireRequest`].

use std::{
    fmt,
    time::{Duration, Instant},
};

use async_trait::async_trait;

use crate::{Backoff, Capabilities, Grant, Lease, LockError, LockInfo, LockName, LockOptions};

/// One store's implementation of the lock contract.
///
/// The trait is deliberately small and used as `Arc<dyn LockBackend>`; reentrancy, guards, the
/// watchdog and the lost signal are built once on top of it by [`LockClient`](crate::LockClient).
/// Backends only talk to their store: every method is one logical operation on one lease.
///
/// Implementations must follow the contract in the crate docs (mutual exclusion, owner-only
/// release and renew, fences, expiry, waiting through the store's own wake-up, no leftovers).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Acquires `request.name()` for `request.ttl()`, waiting up to `request.wait()` for the
    /// current holder to release (zero: one try). Waiting uses the store's own notification
    /// where it has one, else jittered back-off bounded by the holder's remaining TTL.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the budget ran out, [`LockError::Foreign`] when the store
    /// holds a value this library did not write, [`LockError::Unavailable`] or
    /// [`LockError::Backend`] on store failures.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing held beyond the TTL (session stores: nothing at all,
    /// cleaned up in the background).
    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError>;

    /// Extends `lease` to `ttl` from now if, and only if, it is the lock's current lease.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] (nothing changed) when the lease is not current.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError>;

    /// Renews each lease for its own [`Lease::ttl`]; one result per lease, in order.
    ///
    /// The default renews one by one; stores that can batch (pipelines, scripts) override it
    /// so the watchdog spends one round trip on many locks.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Grant, LockError>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            out.push(self.renew(lease, lease.ttl()).await);
        }
        out
    }

    /// Releases `lease` if, and only if, it is the lock's current lease, and wakes waiters.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] (nothing changed) when the lease is not current.
    async fn release(&self, lease: &Lease) -> Result<(), LockError>;

    /// Who holds `name` now, when it expires and its fence; `None` when it is free.
    ///
    /// # Errors
    /// [`LockError::Foreign`] when the store holds a value this library did not write.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError>;
}

/// A validated request to acquire one lock.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    name: LockName,
    ttl: Duration,
    wait: Duration,
    backoff: Backoff,
    started: Instant,
}

impl AcquireRequest {
    /// A request for `name` with the TTL, wait budget and back-off of `options`; the wait
    /// budget starts now.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] when `options` fail [`LockOptions::validate`].
    pub fn new(name: LockName, options: &LockOptions) -> Result<Self, LockError> {
        options.validate()?;
        Ok(Self {
            name,
            ttl: options.ttl,
            wait: options.wait,
            backoff: options.backoff.clone(),
            started: Instant::now(),
        })
    }

    /// The lock to acquire.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait budget (zero: one try).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The back-off for stores without push wake-ups.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// When the request was made.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// When the wait budget runs out.
    pub fn deadline(&self) -> Instant {
        self.started + self.wait
    }

    /// The [`LockError::Timeout`] for this request.
    pub fn timeout_error(&self) -> LockError {
        LockError::Timeout {
            name: self.name.to_string(),
            waited: self.started.elapsed(),
        }
    }
}
