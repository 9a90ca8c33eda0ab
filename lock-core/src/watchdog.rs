//! The watchdog: one background task per client that renews every held lease of that client,
//! batching renewals that fall due together into one `renew_many` call, and ends holds at their
//! local deadline or `max_hold`.

use std::{
    sync::{Arc, Mutex, PoisonError, Weak},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use crate::{
    client::ClientShared,
    hold::{Hold, Plan, Status},
};

#[derive(Default)]
pub(crate) struct Watchdog {
    list: Mutex<List>,
    wake: Notify,
}

#[derive(Default)]
struct List {
    holds: Vec<Weak<Hold>>,
    running: bool,
}

impl Watchdog {
    /// Starts watching `hold`, starting the task if it is not running.
    pub(crate) fn register(&self, client: &Arc<ClientShared>, hold: &Arc<Hold>) {
        let start = {
            let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
            list.holds.push(Arc::downgrade(hold));
            !std::mem::replace(&mut list.running, true)
        };
        if start {
            let client = client.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(run(client));
                }
                Err(_) => {
                    // Unreachable in practice (acquire runs on a runtime); without one the
                    // local deadline still ends the hold through `is_held` and `lost`.
                    self.list
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .running = false;
                }
            }
        } else {
            self.wake();
        }
    }

    /// Re-plans at once (a hold was added or extended).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// The live holds (dropping ended ones).
    fn live(&self) -> Vec<Arc<Hold>> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
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
            list.running = false;
            return true;
        }
        false
    }
}

/// How long an idle watchdog task waits for a new hold before it ends (so a client that
/// acquires and releases in a loop does not spawn a task per cycle).
const IDLE: Duration = Duration::from_secs(5);

async fn run(client: Arc<ClientShared>) {
    let watchdog = &client.watchdog;
    loop {
        let holds = watchdog.live();
        if holds.is_empty() {
            let notified = watchdog.wake.notified();
            tokio::select! {
                () = notified => continue,
                () = tokio::time::sleep(IDLE) => {
                    if watchdog.stop_if_idle() {
                        return;
                    }
                    continue;
                }
            }
        }
        let now = Instant::now();
        let mut wake_at = now + Duration::from_secs(3600);
        let (mut batch, mut leases) = (Vec::new(), Vec::new());
        let mut single = Vec::new();
        let mut ended = Vec::new();
        for hold in holds {
            match hold.plan(now) {
                Plan::Sleep(at) => wake_at = wake_at.min(at),
                Plan::Renew(lease, ttl) if ttl == lease.ttl() => {
                    batch.push(hold);
                    leases.push(lease);
                }
                Plan::Renew(lease, ttl) => single.push((hold, lease, ttl)),
                Plan::End(lease) => ended.push(lease),
            }
        }
        if batch.is_empty() && single.is_empty() && ended.is_empty() {
            let notified = watchdog.wake.notified();
            tokio::select! {
                () = tokio::time::sleep_until(wake_at.into()) => {}
                () = notified => {}
            }
            continue;
        }
        for lease in ended {
            // The hold is over on our side; free the store so waiters need not wait the TTL.
            let _ = client.backend.release(&lease).await;
        }
        if !batch.is_empty() {
            let sent = Instant::now();
            let limit = batch
                .iter()
                .map(|hold| hold.deadline().saturating_duration_since(sent))
                .min()
                .unwrap_or_default()
                .max(Duration::from_millis(1));
            match tokio::time::timeout(limit, client.backend.renew_many(&leases)).await {
                Ok(results) if results.len() == batch.len() => {
                    for (hold, result) in batch.iter().zip(results) {
                        hold.apply_renewal(result, false, sent);
                    }
                }
                _ => {
                    for hold in &batch {
                        hold.retry_soon(sent);
                    }
                }
            }
            tracing::trace!(locks = batch.len(), "watchdog renewed a batch");
        }
        for (hold, lease, ttl) in single {
            let sent = Instant::now();
            let limit = hold
                .deadline()
                .saturating_duration_since(sent)
                .max(Duration::from_millis(1));
            match tokio::time::timeout(limit, client.backend.renew(&lease, ttl)).await {
                Ok(result) => hold.apply_renewal(result, true, sent),
                Err(_) => hold.retry_soon(sent),
            }
        }
    }
}
