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
    reentry::Reentry,
};

/// A held lock.
///
/// While the guard lives a background watchdog renews the lease (every TTL/3 by default) and
/// stops at release, drop, loss, or `max_hold`. The guard is `Send + 'static`: move it into a
/// task freely.
///
/// - [`release`](LockGuard::release) is the documented way to end a hold: it reports the
///   outcome.
/// - Dropping the guard releases in the background, on any thread: on the thread's Tokio
///   runtime, else on the runtime the lock was acquired on. It never panics; only if that
///   runtime has shut down does the lease end by itself (at its TTL, or with its session).
/// - With reentrancy, every guard of the same holder and name shares one store lease; the lease
///   is released when the last guard is.
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    hold: Arc<Hold>,
    /// The reentry table of the client that acquired the hold: the last guard to leave forgets
    /// the hold there.
    reentry: Arc<Reentry>,
    active: bool,
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>, reentry: Arc<Reentry>) -> Self {
        Self {
            hold,
            reentry,
            active: true,
        }
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
    /// Renewals of one hold never overlap: `extend` waits for a watchdog renewal in flight to
    /// be answered before it sends its own, so the store applies them in the order their
    /// answers are counted.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of range (nothing changes);
    /// [`LockError::Lost`] when the hold is already lost or the store says it is not ours;
    /// [`LockError::Unavailable`] when the store could not be reached (the hold stays as it was).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease; the hold stays valid either
    /// way, but until it ends the local deadline counts on no more than the shorter of the old
    /// TTL and `ttl` (the store may apply the abandoned request at any later moment).
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        crate::backend::validate_ttl(ttl)?;
        let _permit = self.hold.renewing.lock().await;
        let lease = self.hold.lease();
        if let Status::Lost(reason) = self.hold.status() {
            return Err(lost(&lease, reason));
        }
        let in_flight = InFlight {
            hold: &self.hold,
            ttl,
            answered: false,
        };
        let result = self.hold.backend.renew(&lease, ttl).await;
        in_flight.answered();
        match result {
            Ok(grant) => {
                self.hold.confirm(grant, false);
                self.hold.renew_now.notify_one();
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
    /// The hold ends on this side at the first poll (`is_held()` is false, the watchdog stops,
    /// `lost()` resolves to `Released`). Dropping the future before the store answered
    /// releases in the background, as dropping the guard does.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.active = false;
        let hold = self.hold.clone();
        if !hold.leave() {
            return Ok(());
        }
        Ending::begin(hold, &self.reentry).finish().await
    }
}

fn lost(lease: &Lease, reason: LossReason) -> LockError {
    LockError::lost(lease.name().to_string(), reason)
}

/// A renewal request of `extend` on its way: abandoned if dropped before its answer.
struct InFlight<'a> {
    hold: &'a Hold,
    ttl: Duration,
    answered: bool,
}

impl InFlight<'_> {
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.hold.abandoned(self.ttl);
        }
    }
}

/// The end of a hold whose last guard left. [`Ending::begin`] ends it on this side at once
/// (released, reentrancy slot forgotten, the watchdog stops); what is left is the store
/// release, done by [`Ending::finish`], or in the background when the `Ending` is dropped
/// unfinished (a dropped guard, a cancelled `release()`).
struct Ending {
    hold: Arc<Hold>,
    status: Status,
    lease: Lease,
    pending: bool,
}

impl Ending {
    fn begin(hold: Arc<Hold>, reentry: &Reentry) -> Self {
        let status = hold.status();
        let lease = hold.lease();
        hold.mark_released();
        reentry.forget(hold.holder.id(), &hold.name, 0);
        // After "not held", a session's end, or the watchdog's release at max_hold, a release
        // could only answer "not held": spare the round trip. A hold that passed its local
        // deadline may still be in the store, so it is released.
        let pending = !matches!(
            status,
            Status::Lost(LossReason::NotHeld | LossReason::SessionEnded | LossReason::MaxHold)
        );
        Self {
            hold,
            status,
            lease,
            pending,
        }
    }

    async fn finish(mut self) -> Result<(), LockError> {
        let result = if self.pending {
            self.hold.backend.release(&self.lease).await
        } else {
            Err(LockError::not_held(&self.hold.name))
        };
        self.pending = false;
        match (self.status, result) {
            (Status::Lost(reason), _) => Err(lost(&self.lease, reason)),
            (_, Ok(())) => {
                tracing::debug!(lock = %self.hold.name, fence = %self.hold.fence, "lock released");
                Ok(())
            }
            (_, Err(LockError::NotHeld { .. })) => Err(lost(&self.lease, LossReason::NotHeld)),
            (_, Err(error)) => Err(error),
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if !self.pending {
            return;
        }
        let (backend, lease) = (self.hold.backend.clone(), self.lease.clone());
        let release = async move {
            if let Err(error) = backend.release(&lease).await {
                tracing::debug!(%error, "background release failed");
            }
        };
        // The runtime of this thread, else the one the hold was acquired on (a guard dropped
        // on a plain thread). If that one has shut down, the task is dropped unrun and the
        // lease ends at its TTL (or with its session).
        match tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.hold.runtime.clone())
        {
            Some(runtime) => {
                runtime.spawn(release);
            }
            None => {
                tracing::debug!(lock = %self.hold.name, "no runtime to release on; the lease will expire");
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.active && self.hold.leave() {
            drop(Ending::begin(self.hold.clone(), &self.reentry));
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
