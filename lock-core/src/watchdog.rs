//! The watchdog: one background task per client that renews every held lease of that client,
//! batching renewals that fall due together into one `renew_many` call, and ends holds at their
//! local deadline or `max_hold`.
//!
//! It never dies silently: a task that ended (its runtime shut down) is started again by the
//! next hold, and each round of renewals runs as its own task, so a backend that panics costs
//! that round (its holds retry soon), not the watchdog.

use std::{
    sync::{Arc, Mutex, PoisonError, Weak},
    time::{Duration, Instant},
};

use tokio::{sync::Notify, task::JoinHandle};

use crate::{
    Lease, LockBackend,
    hold::{Hold, Plan, RenewPermit, Status},
};

/// The holds one client renews, and the task renewing them.
pub(crate) struct Watchdog {
    backend: Arc<dyn LockBackend>,
    list: Mutex<List>,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct List {
    holds: Vec<Weak<Hold>>,
    /// The running task, if any; a finished one (its runtime shut down) is replaced.
    task: Option<JoinHandle<()>>,
    /// Set by the task just before it sleeps: the instant by which it wakes and plans again by
    /// itself. A new hold with nothing to do before then need not wake it (a client that takes
    /// and releases locks in a loop then costs the task no wake-up per cycle: on a runtime of
    /// several threads, a wake-up of another thread). Cleared when the task plans again
    /// ([`Watchdog::live`]) and when a task is started. It stays set, past, from the moment
    /// the sleep ends until then, and after an idle task ended: a hold registered then finds
    /// the task on its way to plan, or no task, which `register` starts.
    sleeps_until: Option<Instant>,
}

impl Watchdog {
    /// A watchdog for the holds of `backend`; its task starts with the first hold.
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Self {
            backend,
            list: Mutex::default(),
            wake: Arc::default(),
        })
    }

    /// What a hold keeps to make this watchdog re-plan at once (see [`Hold::renew_now`]).
    pub(crate) fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Starts watching `hold`, starting the task if none is running, and waking it when the
    /// hold has something due before the task would wake by itself.
    pub(crate) fn register(self: &Arc<Self>, hold: &Arc<Hold>) {
        let due = hold.wake_at();
        let wake = {
            let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
            list.holds.push(Arc::downgrade(hold));
            let running = list.task.as_ref().is_some_and(|task| !task.is_finished());
            if !running {
                // Acquire runs on a runtime, so there is one; without one the local deadline
                // still ends the hold through `is_held` and `lost`.
                list.sleeps_until = None;
                list.task = tokio::runtime::Handle::try_current()
                    .ok()
                    .map(|runtime| runtime.spawn(run(self.clone())));
            }
            list.sleeps_until.is_none_or(|wakes| due < wakes)
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// Records that the task is about to sleep until `until` at the latest. A hold registered
    /// after [`Watchdog::live`] and before this call found `sleeps_until` empty and woke the
    /// task (a `Notify` permit, which ends the coming sleep at once).
    fn sleeping_until(&self, until: Instant) {
        self.list
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sleeps_until = Some(until);
    }

    /// The live holds (dropping ended ones); the task is awake from here until it sleeps again.
    fn live(&self) -> Vec<Arc<Hold>> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.sleeps_until = None;
        let mut live = Vec::with_capacity(list.holds.len());
        list.holds.retain(|weak| match weak.upgrade() {
            Some(hold) if hold.status() == Status::Held => {
                live.push(hold);
                true
            }
            _ => false,
        });
        live
    }

    /// Marks the task stopped if there is still nothing to watch; false when there is.
    fn stop_if_idle(&self) -> bool {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if list.holds.is_empty() {
            list.task = None;
            return true;
        }
        false
    }
}

/// How long an idle watchdog task waits for a new hold before it ends (so a client that
/// acquires and releases in a loop does not spawn a task per cycle).
const IDLE: Duration = Duration::from_secs(5);

/// Renewals of one round: those at the lease's own TTL share one `renew_many`; shortened ones
/// (ending at `max_hold`) go one by one.
#[derive(Default)]
struct Round {
    batch: Vec<(Arc<Hold>, Lease, RenewPermit)>,
    single: Vec<(Arc<Hold>, Lease, Duration, RenewPermit)>,
}

impl Round {
    fn is_empty(&self) -> bool {
        self.batch.is_empty() && self.single.is_empty()
    }

    /// The holds of the round and the TTL each asked for.
    fn holds(&self) -> Vec<(Arc<Hold>, Duration)> {
        let batch = self.batch.iter().map(|(h, l, _)| (h.clone(), l.ttl()));
        let single = self.single.iter().map(|(h, _, ttl, _)| (h.clone(), *ttl));
        batch.chain(single).collect()
    }
}

async fn run(watchdog: Arc<Watchdog>) {
    loop {
        let holds = watchdog.live();
        if holds.is_empty() {
            let idle_end = Instant::now() + IDLE;
            watchdog.sleeping_until(idle_end);
            let notified = watchdog.wake.notified();
            tokio::select! {
                () = notified => continue,
                () = tokio::time::sleep_until(idle_end.into()) => {
                    if watchdog.stop_if_idle() {
                        return;
                    }
                    continue;
                }
            }
        }
        let now = Instant::now();
        let mut wake_at = now + Duration::from_secs(3600);
        let mut round = Round::default();
        for hold in holds {
            match hold.plan(now) {
                Plan::Sleep(at) => wake_at = wake_at.min(at),
                Plan::Renew(lease, ttl, permit) if ttl == lease.ttl() => {
                    round.batch.push((hold, lease, permit));
                }
                Plan::Renew(lease, ttl, permit) => round.single.push((hold, lease, ttl, permit)),
                Plan::End(lease) => {
                    // The hold is over on our side; free the store so waiters need not wait
                    // the TTL. In the background: a hanging release must not stall renewals.
                    let backend = watchdog.backend.clone();
                    tokio::spawn(async move {
                        if let Err(error) = backend.release(&lease).await {
                            tracing::debug!(%error, "release at max_hold failed");
                        }
                    });
                }
            }
        }
        if round.is_empty() {
            watchdog.sleeping_until(wake_at);
            let notified = watchdog.wake.notified();
            tokio::select! {
                () = tokio::time::sleep_until(wake_at.into()) => {}
                () = notified => {}
            }
            continue;
        }
        let holds = round.holds();
        if let Err(error) = tokio::spawn(renew(watchdog.backend.clone(), round)).await {
            tracing::error!(%error, "a renewal round failed; its locks retry soon");
            let now = Instant::now();
            for (hold, ttl) in holds {
                hold.abandoned(ttl);
                hold.retry_soon(now);
            }
        }
    }
}

/// Sends one round's renewals and applies the answers, each bounded by the hold's deadline.
async fn renew(backend: Arc<dyn LockBackend>, round: Round) {
    if !round.batch.is_empty() {
        let leases: Vec<Lease> = round.batch.iter().map(|(_, l, _)| l.clone()).collect();
        let sent = Instant::now();
        let limit = round
            .batch
            .iter()
            .map(|(hold, _, _)| hold.deadline().saturating_duration_since(sent))
            .min()
            .unwrap_or_default()
            .max(Duration::from_millis(1));
        match tokio::time::timeout(limit, backend.renew_many(&leases)).await {
            Ok(Ok(results)) if results.len() == round.batch.len() => {
                for ((hold, _, _), result) in round.batch.iter().zip(results) {
                    hold.apply_renewal(result, false, sent);
                }
            }
            Ok(answer) => {
                // The batch failed as a whole, or answered for the wrong number of leases.
                if let Err(error) = &answer {
                    tracing::debug!(%error, "a batched renewal failed; its locks retry soon");
                } else {
                    tracing::debug!("a batched renewal answered for the wrong number of locks");
                }
                for (hold, _, _) in &round.batch {
                    hold.retry_soon(sent);
                }
            }
            Err(_) => {
                for (hold, lease, _) in &round.batch {
                    hold.abandoned(lease.ttl());
                    hold.retry_soon(sent);
                }
            }
        }
        tracing::trace!(locks = round.batch.len(), "watchdog renewed a batch");
    }
    for (hold, lease, ttl, _permit) in round.single {
        let sent = Instant::now();
        let limit = hold
            .deadline()
            .saturating_duration_since(sent)
            .max(Duration::from_millis(1));
        match tokio::time::timeout(limit, backend.renew(&lease, ttl)).await {
            Ok(result) => hold.apply_renewal(result, true, sent),
            Err(_) => {
                hold.abandoned(ttl);
                hold.retry_soon(sent);
            }
        }
    }
}
