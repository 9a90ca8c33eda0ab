//! The face for backend authors: the [`LockBackend`] trait every store implements, the
//! [`AcquireRequest`] it is handed, what it answers with ([`Grant`], [`LeaseToken`],
//! [`EndSignal`]), and the helpers stores without push wake-ups wait with
//! ([`poll_until_acquired`], [`Attempt`]).
//!
//! Users of a lock never need this module: they import from the crate root.

use std::{fmt, sync::Arc, time::Duration};

pub use async_trait::async_trait;

use crate::{Capabilities, Lease, LockError, LockInfo, LockName};
pub use crate::{
    end_signal::{EndNotifier, EndSignal, end_signal},
    error::BoxError,
    lease::{Grant, LeaseToken, local_deadline},
    options::validate_ttl,
    redact::redact_url,
    request::AcquireRequest,
    store_url::{MAX_URL_LEN, StoreUrl, percent_decode},
    waiting::{Attempt, poll_until_acquired},
};

/// One store's implementation of the lock contract.
///
/// The trait is deliberately small and used as `Arc<dyn LockBackend>`; reentrancy, guards, the
/// watchdog and the lost signal are built once on top of it by [`LockClient`](crate::LockClient).
/// Backends only talk to their store: every method is one logical operation on one lease.
///
/// Implementations must follow the contract in the crate docs (mutual exclusion, owner-only
/// release and renew, fences, expiry, waiting through the store's own wake-up, no leftovers).
///
/// `Arc<T>` and `Box<T>` of a backend (`T` may be `dyn LockBackend`) are backends too. A
/// wrapper (see [`layer`](crate::layer)) forwards every method, `renew_many` included, and
/// says so with `#[deny(clippy::missing_trait_methods)]` on its impl.
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// A short name of the store for logs, spans and metrics (`redis`, `mysql`, ...).
    fn store(&self) -> &'static str {
        "unknown"
    }

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
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have renewed the lease; lock-core then counts on no
    /// more than the shorter of the old TTL and `ttl`.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError>;

    /// Renews each lease for its own [`Lease::ttl`]; one result per lease, in order.
    ///
    /// The default renews one by one; stores that can batch (pipelines, scripts) override it
    /// so the watchdog spends one round trip on many locks.
    ///
    /// # Errors
    /// The outer error is the batch failing as a whole (a transaction or pipeline that got no
    /// usable answer): then the watchdog retries each lease soon. A lease that is not current
    /// is an inner [`LockError::NotHeld`].
    ///
    /// # Cancel safety
    /// As [`LockBackend::renew`], for each lease.
    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        renew_one_by_one(self, leases).await
    }

    /// Releases `lease` if, and only if, it is the lock's current lease, and wakes waiters.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] (nothing changed) when the lease is not current.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have released the lease; it ends at its TTL (or with
    /// its session) either way.
    async fn release(&self, lease: &Lease) -> Result<(), LockError>;

    /// Who holds `name` now, when it expires and its fence; `None` when it is free.
    ///
    /// # Errors
    /// [`LockError::Foreign`] when the store holds a value this library did not write.
    ///
    /// # Cancel safety
    /// A read: dropping the future changes nothing.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError>;
}

/// Renews each lease for its own TTL through `backend.renew`, one after the other: what
/// [`LockBackend::renew_many`] does by default, for a wrapper that must route batches through
/// its own `renew`.
///
/// # Errors
/// None of its own: each lease's answer is in the list.
pub async fn renew_one_by_one<B: LockBackend + ?Sized>(
    backend: &B,
    leases: &[Lease],
) -> Result<Vec<Result<Grant, LockError>>, LockError> {
    let mut out = Vec::with_capacity(leases.len());
    for lease in leases {
        out.push(backend.renew(lease, lease.ttl()).await);
    }
    Ok(out)
}

/// Renews each lease for its own TTL through `backend.renew`, all requests in flight at once:
/// for a store whose connection carries many requests (one round-trip wait in all) but has
/// no batch of its own.
///
/// # Errors
/// None of its own: each lease's answer is in the list.
pub async fn renew_concurrently<B: LockBackend + ?Sized>(
    backend: &B,
    leases: &[Lease],
) -> Result<Vec<Result<Grant, LockError>>, LockError> {
    Ok(
        futures::future::join_all(leases.iter().map(|lease| backend.renew(lease, lease.ttl())))
            .await,
    )
}

/// Forwards every method to the backend behind a smart pointer.
macro_rules! forward_backend {
    ($pointer:ident) => {
        #[async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl<T: LockBackend + ?Sized> LockBackend for $pointer<T> {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn store(&self) -> &'static str {
                (**self).store()
            }
            async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
                (**self).acquire(request).await
            }
            async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
                (**self).renew(lease, ttl).await
            }
            async fn renew_many(
                &self,
                leases: &[Lease],
            ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
                (**self).renew_many(leases).await
            }
            async fn release(&self, lease: &Lease) -> Result<(), LockError> {
                (**self).release(lease).await
            }
            async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
                (**self).inspect(name).await
            }
        }
    };
}

forward_backend!(Arc);
forward_backend!(Box);
