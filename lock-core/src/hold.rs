//! The shared state of one store lease: what every reentrant guard of it sees, what the
//! watchdog renews, and what the lost signal watches.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use tokio::{
    runtime::Handle,
    sync::{Notify, watch},
};

use crate::{
    Fence, Holder, Lease, LockError, LockName, LockOptions, LossReason,
    backend::{EndSignal, Grant, LockBackend, local_deadline},
    lease::drift,
};

/// Where a hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Held,
    Lost(LossReason),
    Released,
}

pub(crate) struct Hold {
    /// The store the hold lives in.
    pub(crate) backend: Arc<dyn LockBackend>,
    /// Wakes the watchdog that renews this hold, so it re-plans at once (after an `extend`).
    pub(crate) renew_now: Arc<Notify>,
    pub(crate) holder: Holder,
    /// Fixed for the life of the hold (renewals keep both), so read without the lock.
    pub(crate) name: LockName,
    pub(crate) fence: Fence,
    /// The backend's signal that the store ended the hold by itself, if it has one.
    end: Option<EndSignal>,
    /// The runtime the hold was acquired on: background work (a release after a drop on a
    /// thread without a runtime) is spawned there.
    pub(crate) runtime: Option<Handle>,
    /// Held across every renewal request of this hold (the watchdog's and `extend`'s), so the
    /// store sees them one at a time, in the order their replies are applied.
    pub(crate) renewing: Arc<tokio::sync::Mutex<()>>,
    state: Mutex<HoldState>,
    status: watch::Sender<Status>,
}

struct HoldState {
    lease: Lease,
    /// Guards alive for this hold (reentrancy depth).
    depth: usize,
    valid_from: Instant,
    deadline: Instant,
    next_renew: Instant,
    renew_every: Option<Duration>,
    watchdog: bool,
    hard_end: Option<Instant>,
    /// The last renewal was shortened to end at `max_hold`.
    capped: bool,
    /// The shortest TTL of a renewal whose request was abandoned (timed out or cancelled)
    /// before its answer: the store may still apply it at any later moment, so no confirmation
    /// may count on more than this TTL from its own send time.
    ttl_floor: Option<Duration>,
}

impl HoldState {
    /// The TTL the local deadline may count on: the lease's, unless an abandoned renewal
    /// asked for less.
    fn effective_ttl(&self) -> Duration {
        let ttl = self.lease.ttl();
        self.ttl_floor.map_or(ttl, |floor| floor.min(ttl))
    }

    /// When the watchdog next has something to do for the hold, nothing being due now.
    fn wake_at(&self) -> Instant {
        let mut wake = self.deadline;
        if self.watchdog {
            wake = wake.min(self.next_renew);
        }
        if let Some(end) = self.hard_end {
            wake = wake.min(end.checked_sub(drift(self.lease.ttl())).unwrap_or(end));
        }
        wake
    }

    fn interval(&self) -> Duration {
        let ttl = self.effective_ttl();
        match self.renew_every {
            Some(every) if every < ttl => every,
            _ => ttl / 3,
        }
    }
}

/// The right to have one renewal request of a hold in flight (see [`Hold::renewing`]).
pub(crate) type RenewPermit = tokio::sync::OwnedMutexGuard<()>;

/// What the watchdog should do with a hold now.
pub(crate) enum Plan {
    /// Nothing before this instant.
    Sleep(Instant),
    /// Renew this lease for this TTL, holding the hold's renewal permit until the answer.
    Renew(Lease, Duration, RenewPermit),
    /// The hold reached `max_hold`; release it in the store so waiters need not wait.
    End(Lease),
}

impl Hold {
    pub(crate) fn new(
        backend: Arc<dyn LockBackend>,
        renew_now: Arc<Notify>,
        holder: Holder,
        grant: Grant,
        options: &LockOptions,
    ) -> Arc<Self> {
        let ttl = grant.lease.ttl();
        let valid_from = grant.valid_from;
        let mut state = HoldState {
            lease: grant.lease.clone(),
            depth: 1,
            valid_from,
            deadline: local_deadline(valid_from, ttl),
            next_renew: valid_from,
            renew_every: options.renew_every,
            watchdog: options.watchdog,
            // A max_hold too far to be an instant is no cap at all.
            hard_end: options.max_hold.and_then(|m| valid_from.checked_add(m)),
            capped: false,
            ttl_floor: None,
        };
        state.next_renew = valid_from + state.interval();
        Arc::new(Self {
            backend,
            renew_now,
            holder,
            name: state.lease.name().clone(),
            fence: state.lease.fence(),
            end: grant.end().cloned(),
            runtime: Handle::try_current().ok(),
            renewing: Arc::new(tokio::sync::Mutex::new(())),
            state: Mutex::new(state),
            status: watch::channel(Status::Held).0,
        })
    }

    fn state(&self) -> MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the hold stands (marking it lost first if the store has ended it).
    pub(crate) fn status(&self) -> Status {
        if let Some(reason) = self.end.as_ref().and_then(EndSignal::ended_now) {
            self.mark_lost(reason);
        }
        *self.status.borrow()
    }

    pub(crate) fn lease(&self) -> Lease {
        self.state().lease.clone()
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.state().deadline
    }

    pub(crate) fn depth(&self) -> usize {
        self.state().depth
    }

    /// Held and inside the local deadline. Marks the hold lost when the deadline has passed.
    pub(crate) fn is_held(&self) -> bool {
        if self.status() != Status::Held {
            return false;
        }
        if Instant::now() >= self.deadline() {
            self.expire();
            return false;
        }
        true
    }

    /// Marks the hold lost because its local deadline passed.
    pub(crate) fn expire(&self) {
        let capped = self.state().capped;
        self.mark_lost(if capped {
            LossReason::MaxHold
        } else {
            LossReason::Expired
        });
    }

    /// Joins the hold as one more reentrant guard, if it is still held by someone.
    pub(crate) fn enter(&self) -> bool {
        let mut state = self.state();
        if state.depth == 0 || self.status() != Status::Held || Instant::now() >= state.deadline {
            return false;
        }
        state.depth += 1;
        true
    }

    /// Leaves the hold; true when this was the last guard.
    pub(crate) fn leave(&self) -> bool {
        let mut state = self.state();
        state.depth = state.depth.saturating_sub(1);
        state.depth == 0
    }

    /// Records a renewal confirmed by the store. The answer to a request older than the one
    /// last confirmed can only shorten the local deadline: the store may have applied the two
    /// in either order.
    pub(crate) fn confirm(&self, grant: Grant, capped: bool) {
        if self.status() != Status::Held {
            return;
        }
        let mut state = self.state();
        if grant.lease.token() != state.lease.token() {
            return;
        }
        let floor = state.ttl_floor.unwrap_or(Duration::MAX);
        let ttl = grant.lease.ttl().min(floor);
        let deadline = grant.valid_from + ttl.saturating_sub(drift(ttl));
        if grant.valid_from < state.valid_from {
            state.deadline = state.deadline.min(deadline);
            return;
        }
        state.valid_from = grant.valid_from;
        state.deadline = deadline;
        state.lease = grant.lease;
        state.capped = capped;
        state.next_renew = state.valid_from + state.interval();
        tracing::debug!(lock = %state.lease.name(), fence = %state.lease.fence(), ?ttl, "lock renewed");
    }

    /// A renewal request for `ttl` was abandoned before its answer (timed out or cancelled):
    /// from now on no confirmation counts on more than `ttl`.
    pub(crate) fn abandoned(&self, ttl: Duration) {
        let mut state = self.state();
        state.ttl_floor = Some(state.ttl_floor.map_or(ttl, |floor| floor.min(ttl)));
    }

    /// A renewal failed for a reason that may pass: try again a quarter interval later (the
    /// deadline, not this schedule, decides when to give up).
    pub(crate) fn retry_soon(&self, now: Instant) {
        let mut state = self.state();
        let step = (state.interval() / 4).max(Duration::from_millis(1));
        // `plan` renews up to a quarter interval early (batching); add that back so the retry
        // really waits `step`.
        state.next_renew = now + step + state.interval() / 4;
    }

    /// Marks the hold lost; true when this call changed it.
    pub(crate) fn mark_lost(&self, reason: LossReason) -> bool {
        let changed = self.status.send_if_modified(|s| {
            if *s == Status::Held {
                *s = Status::Lost(reason);
                true
            } else {
                false
            }
        });
        if changed {
            tracing::warn!(lock = %self.name, fence = %self.fence, %reason, "lock lost");
        }
        changed
    }

    pub(crate) fn mark_released(&self) {
        self.status.send_if_modified(|s| {
            if *s == Status::Released {
                false
            } else {
                *s = Status::Released;
                true
            }
        });
    }

    /// What the watchdog should do now.
    pub(crate) fn plan(&self, now: Instant) -> Plan {
        let mut state = self.state();
        let far = now + Duration::from_secs(3600);
        if self.status() != Status::Held {
            return Plan::Sleep(far);
        }
        if let Some(end) = state.hard_end
            && now + drift(state.lease.ttl()) >= end
        {
            drop(state);
            self.mark_lost(LossReason::MaxHold);
            return Plan::End(self.lease());
        }
        if now >= state.deadline {
            // The store expires the lease by itself a drift margin later; releasing it here
            // would gain nothing and would hide a store that fails to expire leases.
            drop(state);
            self.expire();
            return Plan::Sleep(far);
        }
        let interval = state.interval();
        // Renew a little early so that locks taken at about the same time share one batch.
        if state.watchdog && now + interval / 4 >= state.next_renew {
            let mut ttl = state.lease.ttl();
            if let Some(end) = state.hard_end {
                ttl = ttl.min(end.saturating_duration_since(now));
            }
            if ttl >= crate::MIN_TTL {
                let Ok(permit) = self.renewing.clone().try_lock_owned() else {
                    // An `extend` is in flight; its answer re-plans (or this retry does).
                    return Plan::Sleep(now + (interval / 4).max(Duration::from_millis(1)));
                };
                // Until the result arrives, do not plan another renewal of this hold.
                state.next_renew = state.deadline;
                return Plan::Renew(state.lease.clone(), ttl, permit);
            }
        }
        Plan::Sleep(state.wake_at())
    }

    /// The instant [`Hold::plan`] would sleep until when nothing is due now: the watchdog's
    /// next renewal of this hold, its end at `max_hold`, or its local deadline. (`plan` renews
    /// up to a quarter of the interval earlier when the watchdog happens to be awake then.)
    pub(crate) fn wake_at(&self) -> Instant {
        self.state().wake_at()
    }

    /// Applies the store's answer to a renewal sent at `sent`.
    pub(crate) fn apply_renewal(
        &self,
        result: Result<Grant, LockError>,
        capped: bool,
        sent: Instant,
    ) {
        match result {
            Ok(grant) => self.confirm(grant, capped),
            Err(LockError::NotHeld { .. } | LockError::Foreign { .. }) => {
                self.mark_lost(LossReason::NotHeld);
            }
            Err(LockError::Lost { reason, .. }) => {
                self.mark_lost(reason);
            }
            Err(error) => {
                tracing::debug!(lock = %self.name, %error, "renewal failed; retrying");
                self.retry_soon(sent);
            }
        }
    }

    /// A future that resolves when the hold can no longer be trusted.
    pub(crate) async fn lost(self: Arc<Self>) -> LossReason {
        let mut rx = self.status.subscribe();
        loop {
            self.status();
            match *rx.borrow_and_update() {
                Status::Lost(reason) => return reason,
                Status::Released => return LossReason::Released,
                Status::Held => {}
            }
            let deadline = self.deadline();
            let ended = async {
                match &self.end {
                    Some(end) => end.ended().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return LossReason::Released;
                    }
                }
                reason = ended => {
                    self.mark_lost(reason);
                }
                () = tokio::time::sleep_until(deadline.into()) => {
                    if Instant::now() >= self.deadline() {
                        self.expire();
                    }
                }
            }
        }
    }
}
