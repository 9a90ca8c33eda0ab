//! [`Metrics`]: a layer that reports what the locks of any backend do through the `metrics`
//! facade crate (feature `metrics`), to whatever recorder the service installed (Prometheus,
//! StatsD, ...). Without a recorder every call is a no-op.
//!
//! | metric | kind | labels |
//! | --- | --- | --- |
//! | `lock_acquire_duration_seconds` | histogram | `store`, `outcome` (`acquired`, `timeout`, `error`) |
//! | `lock_contended_total` | counter | `store`: acquisitions that found the lock taken |
//! | `lock_hold_duration_seconds` | histogram | `store`: grant to release or loss |
//! | `lock_lost_total` | counter | `store`, `reason` (`not_held`, `session_ended`, `expired`, `max_hold`) |
//! | `lock_renew_duration_seconds` | histogram | `store` |
//! | `lock_renew_failures_total` | counter | `store` |
//! | `lock_held` | gauge | `store`: holds granted and not yet released or lost |
//! | `lock_waiting` | gauge | `store`: acquisitions in progress |
//!
//! **No lock name by default**: names are unbounded (job ids, tenants) and every label value
//! is a time series. [`Metrics::name_label`] adds a `name` label through a mapper that keeps
//! it bounded (a prefix, a class), or leaves it out (`None`).
//!
//! **Contention** is counted exactly, per call of the store: an acquisition with a wait
//! budget first makes one try (a zero budget); only when the lock is taken does it go on to
//! wait with its own budget. An uncontended acquisition costs nothing more; a contended one,
//! one try more, beside a wait. Like every figure here it is per call of the backend: an
//! acquisition the client retries after an outage (within its budget) counts once per try.
//!
//! **Losses** this layer sees are the store's answers to renewals (`not_held`,
//! `session_ended`) and holds whose last confirmed lease ran out without a release
//! (`expired`, counted when the layer next looks: at a call, at most once a second).

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use metrics::{Label, counter, gauge, histogram};

use crate::{
    Capabilities, Lease, LockError, LockInfo, LockName, LossReason,
    backend::{AcquireRequest, Grant, LeaseToken, LockBackend, async_trait},
    client::outcome,
};

/// Maps a lock name to its `name` label, or to none.
type NameLabel = Arc<dyn Fn(&LockName) -> Option<String> + Send + Sync>;

/// A hold the layer saw granted and not yet released or lost.
struct Held {
    since: Instant,
    /// When its last confirmed lease ends.
    until: Instant,
    labels: Vec<Label>,
}

/// The `lock_waiting` gauge of one call in progress: counted up now, down when dropped.
struct Waiting(metrics::Gauge);

impl Waiting {
    fn new(gauge: metrics::Gauge) -> Self {
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Reports every call of the wrapped backend as metrics (see the module's table).
///
/// ```
/// use std::sync::Arc;
/// use lock_core::{LockClient, MemoryBackend, layer::Metrics};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// // Jobs are named `jobs/<id>`: the label keeps the class, never the id.
/// let backend = Metrics::new(MemoryBackend::new())
///     .name_label(|name| name.as_str().split('/').next().map(str::to_owned));
/// let client = LockClient::new(backend);
/// client.lock("jobs/7").await?.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct Metrics<B> {
    inner: B,
    store: &'static str,
    name_label: Option<NameLabel>,
    held: Mutex<HashMap<LeaseToken, Held>>,
    /// When [`Metrics::prune`] looks next.
    next_prune: Mutex<Instant>,
}

/// How often expired holds are looked for (and counted as lost).
const PRUNE_EVERY: Duration = Duration::from_secs(1);

impl<B: fmt::Debug> fmt::Debug for Metrics<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("inner", &self.inner)
            .field("store", &self.store)
            .field("name_label", &self.name_label.is_some())
            .finish_non_exhaustive()
    }
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn reason_label(reason: LossReason) -> &'static str {
    match reason {
        LossReason::NotHeld => "not_held",
        LossReason::Expired => "expired",
        LossReason::SessionEnded => "session_ended",
        LossReason::MaxHold => "max_hold",
        LossReason::Released => "released",
    }
}

impl<B: LockBackend> Metrics<B> {
    /// Reports `inner`'s calls, labelled with its [`LockBackend::store`].
    pub fn new(inner: B) -> Self {
        let store = inner.store();
        Self {
            inner,
            store,
            name_label: None,
            held: Mutex::new(HashMap::new()),
            next_prune: Mutex::new(Instant::now()),
        }
    }

    /// Adds a `name` label with `map`'s value for each lock (none where it answers `None`).
    /// Keep its values few: each is a time series in the recorder.
    #[must_use]
    pub fn name_label(
        mut self,
        map: impl Fn(&LockName) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.name_label = Some(Arc::new(map));
        self
    }

    fn labels(&self, name: &LockName) -> Vec<Label> {
        let mut labels = vec![Label::new("store", self.store)];
        if let Some(value) = self.name_label.as_ref().and_then(|map| map(name)) {
            labels.push(Label::new("name", value));
        }
        labels
    }

    fn held(&self) -> MutexGuard<'_, HashMap<LeaseToken, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts holds whose last confirmed lease ran out unreleased as lost (`expired`). Looks
    /// at most once per [`PRUNE_EVERY`]: the scan covers every held lock, and acquisitions
    /// and renewals are the hot path.
    fn prune(&self) {
        let now = Instant::now();
        {
            let mut next = self
                .next_prune
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if now < *next {
                return;
            }
            *next = now + PRUNE_EVERY;
        }
        let expired: Vec<Held> = self
            .held()
            .extract_if(|_, h| h.until < now)
            .map(|(_, hold)| hold)
            .collect();
        for hold in expired {
            self.ended(hold, Some(LossReason::Expired));
        }
    }

    fn granted(&self, grant: &Grant, labels: Vec<Label>) {
        gauge!("lock_held", labels.clone()).increment(1.0);
        self.held().insert(
            grant.lease.token().clone(),
            Held {
                since: grant.valid_from,
                until: grant.valid_from + grant.lease.ttl(),
                labels,
            },
        );
    }

    fn ended(&self, hold: Held, lost: Option<LossReason>) {
        histogram!("lock_hold_duration_seconds", hold.labels.clone())
            .record(seconds(hold.since.elapsed()));
        gauge!("lock_held", hold.labels.clone()).decrement(1.0);
        if let Some(reason) = lost {
            let mut labels = hold.labels;
            labels.push(Label::new("reason", reason_label(reason)));
            counter!("lock_lost_total", labels).increment(1);
        }
    }

    /// Notes a renewal's answer for `lease`.
    fn renewed(&self, lease: &Lease, result: &Result<Grant, LockError>, took: Duration) {
        let labels = self.labels(lease.name());
        histogram!("lock_renew_duration_seconds", labels.clone()).record(seconds(took));
        let lost = match result {
            Ok(grant) => {
                if let Some(hold) = self.held().get_mut(lease.token()) {
                    hold.until = grant.valid_from + grant.lease.ttl();
                }
                return;
            }
            Err(LockError::NotHeld { .. }) => Some(LossReason::NotHeld),
            Err(LockError::Lost { reason, .. }) => Some(*reason),
            Err(_) => None,
        };
        counter!("lock_renew_failures_total", labels).increment(1);
        if let Some(reason) = lost
            && let Some(hold) = self.held().remove(lease.token())
        {
            self.ended(hold, Some(reason));
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<B: LockBackend> LockBackend for Metrics<B> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn store(&self) -> &'static str {
        self.store
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.prune();
        let start = Instant::now();
        let labels = self.labels(request.name());
        // Counted down however the call ends, a dropped future included.
        let _waiting = Waiting::new(gauge!("lock_waiting", labels.clone()));
        let first = self.inner.acquire(&request.one_try()).await;
        let result = match first {
            Err(LockError::Timeout { .. }) => {
                counter!("lock_contended_total", labels.clone()).increment(1);
                if request.wait().is_zero() {
                    first
                } else {
                    self.inner.acquire(request).await
                }
            }
            other => other,
        };
        let mut outcome_labels = labels.clone();
        outcome_labels.push(Label::new("outcome", outcome(&result)));
        histogram!("lock_acquire_duration_seconds", outcome_labels)
            .record(seconds(start.elapsed()));
        if let Ok(grant) = &result {
            self.granted(grant, labels);
        }
        result
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        self.prune();
        let start = Instant::now();
        let result = self.inner.renew(lease, ttl).await;
        self.renewed(lease, &result, start.elapsed());
        result
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        self.prune();
        let start = Instant::now();
        let results = match self.inner.renew_many(leases).await {
            Ok(results) => results,
            Err(error) => {
                // The batch failed as a whole: a failed renewal of each lease in it.
                for lease in leases {
                    counter!("lock_renew_failures_total", self.labels(lease.name())).increment(1);
                }
                return Err(error);
            }
        };
        let took = start.elapsed();
        for (lease, result) in leases.iter().zip(&results) {
            self.renewed(lease, result, took);
        }
        Ok(results)
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let result = self.inner.release(lease).await;
        let hold = self.held().remove(lease.token());
        if let Some(hold) = hold {
            let lost = match &result {
                Err(LockError::NotHeld { .. }) => Some(LossReason::NotHeld),
                Err(LockError::Lost { reason, .. }) => Some(*reason),
                _ => None,
            };
            self.ended(hold, lost);
        }
        result
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(name).await
    }
}
