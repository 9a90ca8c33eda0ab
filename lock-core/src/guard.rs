//! [`LockGuard`]: the user-facing hold, and [`Lost`], its loss signal.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use crate::{
    Fence, Holder, Lease, LockError, LockName, LossReason,
    hold::{Hold, Status},
};

/// A held lock.
///
/// While the guard lives a background watchdog renews the lease (every TTL/3 by default) and
/// stops at release, drop, loss, or `max_hold`. The guard is `Send + 'static`: move it into a
/// task freely.
///
/// - [`release`](LockGuard::release) is the documented way to end a hold: it reports the
///   outcome.
/// - Dropping the guard releases in the background when a Tokio runtime is present; without one
///   it never panics and the lease simply expires at its TTL.
/// - With reentrancy, every guard of the same holder and name shares one store lease; the lease
///   is released when the last guard is.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    hold: Arc<Hold>,
    active: bool,
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>) -> Self {
        Self { hold, active: true }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.hold.name
    }

    /// The fencing token of this hold: pass it to the protected resource.
    pub fn fence(&self) -> Fence {
        self.hold.fence
    }

    /// The current lease (its expiry moves with every renewal).
    pub fn lease(&self) -> Lease {
        self.hold.lease()
    }

    /// The holder that owns this hold.
    pub fn holder(&self) -> &Holder {
        &self.hold.holder
    }

    /// How many guards of this holder share the hold (reentrancy depth).
    pub fn depth(&self) -> usize {
        self.hold.depth()
    }

    /// Whether the hold can still be trusted: not lost, not released, and inside its local
    /// deadline (last confirmed expiry minus a drift margin, on a monotonic clock).
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// A future that resolves, with the reason, as soon as the hold can no longer be trusted:
    /// the store answered a renewal with "not held", the local deadline passed without a
    /// confirmed renewal, the session ended, or `max_hold` was reached. After that
    /// [`is_held`](LockGuard::is_held) is false.
    ///
    /// The future is `Send + 'static` and independent of the guard; if every guard is released
    /// first it resolves to [`LossReason::Released`].
    ///
    /// # Cancel safety
    /// Dropping the future has no effect on the hold.
    pub fn lost(&self) -> Lost {
        Lost {
            inner: Box::pin(self.hold.clone().lost()),
        }
    }

    /// Extends the lease to `ttl` from now (the watchdog then keeps renewing at the new TTL).
    ///
    /// On session stores (capabilities say `Expiry::Session`) the hold lasts as long as the
    /// session and `ttl` cannot change that: `extend` only confirms the hold is still there,
    /// and the lease keeps the session timeout as its TTL.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of range (nothing changes);
    /// [`LockError::Lost`] when the hold is already lost or the store says it is not ours;
    /// [`LockError::Unavailable`] when the store could not be reached (the hold stays as it was).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease; the hold stays valid either way.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        crate::validate_ttl(ttl)?;
        let lease = self.hold.lease();
        if let Status::Lost(reason) = self.hold.status() {
            return Err(lost(&lease, reason));
        }
        match self.hold.client.backend.renew(&lease, ttl).await {
            Ok(grant) => {
                self.hold.confirm(grant, false);
                self.hold.client.watchdog.wake();
                Ok(())
            }
            Err(LockError::NotHeld { .. } | LockError::Foreign { .. }) => {
                self.hold.mark_lost(LossReason::NotHeld);
                Err(lost(&lease, LossReason::NotHeld))
            }
            Err(LockError::Lost { reason, .. }) => {
                self.hold.mark_lost(reason);
                Err(lost(&lease, reason))
            }
            Err(other) => Err(other),
        }
    }

    /// Releases this guard. The store lease is released when the last guard of the hold is,
    /// and waiters are woken.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the hold had been lost before the release (the critical section
    /// ran without the lock for a while: act accordingly); [`LockError::Unavailable`] when the
    /// store could not be reached (the lease then ends at its TTL).
    ///
    /// # Cancel safety
    /// Dropping the future releases in the background, as dropping the guard does.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.active = false;
        let hold = self.hold.clone();
        if !hold.leave() {
            return Ok(());
        }
        end_hold(hold).await
    }
}

fn lost(lease: &Lease, reason: LossReason) -> LockError {
    LockError::Lost {
        name: lease.name().to_string(),
        reason,
    }
}

/// Ends a hold whose last guard left: releases the store lease (unless the store can no longer
/// have it) and forgets the reentrancy slot.
pub(crate) async fn end_hold(hold: Arc<Hold>) -> Result<(), LockError> {
    let lease = hold.lease();
    let status = hold.status();
    // After "not held", a session's end, or the watchdog's release at max_hold, a release
    // could only answer "not held": spare the round trip. A hold that passed its local
    // deadline may still be in the store, so it is released.
    let result = match status {
        Status::Lost(LossReason::NotHeld | LossReason::SessionEnded | LossReason::MaxHold) => {
            Err(LockError::not_held(&hold.name))
        }
        _ => hold.client.backend.release(&lease).await,
    };
    hold.mark_released();
    hold.holder.forget_slot(hold.client.id, &hold.name, 0);
    match (status, result) {
        (Status::Lost(reason), _) => Err(lost(&lease, reason)),
        (_, Ok(())) => {
            tracing::debug!(lock = %hold.name, fence = %hold.fence, "lock released");
            Ok(())
        }
        (_, Err(LockError::NotHeld { .. })) => Err(lost(&lease, LossReason::NotHeld)),
        (_, Err(error)) => Err(error),
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.active || !self.hold.leave() {
            return;
        }
        let hold = self.hold.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = end_hold(hold).await {
                        tracing::debug!(%error, "background release after drop failed");
                    }
                });
            }
            Err(_) => {
                // No runtime to talk to the store: stop renewing; the lease ends at its TTL.
                hold.mark_released();
                hold.holder.forget_slot(hold.client.id, &hold.name, 0);
                tracing::debug!(lock = %hold.name, "guard dropped without a runtime; lease will expire");
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.hold.name)
            .field("fence", &self.hold.fence)
            .field("held", &self.is_held())
            .finish()
    }
}

/// The future returned by [`LockGuard::lost`]: resolves to the [`LossReason`].
#[must_use = "futures do nothing unless awaited"]
pub struct Lost {
    inner: Pin<Box<dyn Future<Output = LossReason> + Send + 'static>>,
}

impl Future for Lost {
    type Output = LossReason;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LossReason> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lost")
    }
}
