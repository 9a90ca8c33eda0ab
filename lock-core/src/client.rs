//! [`LockClient`]: the user-facing entry point over any [`LockBackend`].

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tracing::Instrument;

use crate::{
    AcquireRequest, Capabilities, Grant, Holder, Lease, LockBackend, LockError, LockGuard,
    LockInfo, LockName, LockOptions, hold::Hold, holder::SlotUse, watchdog::Watchdog,
};

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// A lock client over one backend: acquires guards for holders, counts reentrancy, runs the
/// watchdog, and signals loss. Cheap to clone (clones share everything).
///
/// Needs a Tokio runtime with timers enabled (the watchdog and the lost signal use them).
///
/// ```
/// use std::time::Duration;
/// use lock_core::{Holder, LockClient, LockName, LockOptions, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let client = LockClient::new(MemoryBackend::new());
/// let name = LockName::new("reports/daily")?;
/// let options = LockOptions::new().ttl(Duration::from_secs(10));
///
/// let job = Holder::new();
/// let guard = client.acquire(&job, &name, &options).await?;
/// // Another holder is excluded until the guard is released.
/// assert!(client.try_acquire(&Holder::new(), &name, &options).await?.is_none());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient {
    shared: Arc<ClientShared>,
}

pub(crate) struct ClientShared {
    pub(crate) id: u64,
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) watchdog: Watchdog,
}

impl LockClient {
    /// A client over `backend`.
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A client over a shared backend (a store chosen at run time).
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Self {
            shared: Arc::new(ClientShared {
                id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
                backend,
                watchdog: Watchdog::default(),
            }),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.shared.backend
    }

    /// What the backend guarantees.
    pub fn capabilities(&self) -> Capabilities {
        self.shared.backend.capabilities()
    }

    /// Acquires `name` for `holder`, waiting up to `options.wait` (zero: one try).
    ///
    /// If `holder` already holds `name` through this client, this re-enters: it returns
    /// another guard on the same store lease at once (`options` of the first acquisition stay
    /// in force), and the lease is released when every guard is.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] (nothing sent to the store), [`LockError::Timeout`] when
    /// the budget ran out, and the backend's errors ([`LockError::Unavailable`],
    /// [`LockError::Foreign`], ...).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing held beyond the TTL; session stores clean up in the
    /// background.
    pub async fn acquire(
        &self,
        holder: &Holder,
        name: &LockName,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let request = AcquireRequest::new(name.clone(), options)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LockError::Unsupported {
                what: "acquiring outside a Tokio runtime (lock-core's watchdog needs one)".into(),
            });
        }
        let span = tracing::debug_span!("lock.acquire", lock = %name, holder = %holder.id());
        self.acquire_inner(holder, request, options)
            .instrument(span)
            .await
    }

    async fn acquire_inner(
        &self,
        holder: &Holder,
        request: AcquireRequest,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let slot_use = SlotUse::new(holder, self.shared.id, request.name());
        let mut slot_guard = match tokio::time::timeout_at(
            request.deadline().into(),
            slot_use.slot().lock(),
        )
        .await
        {
            Ok(guard) => guard,
            Err(_) => return Err(request.timeout_error()),
        };
        if let Some(hold) = slot_guard.upgrade()
            && hold.enter()
        {
            tracing::debug!(depth = hold.depth(), "lock re-entered");
            return Ok(LockGuard::new(hold));
        }
        let grant = self.grant(&request).await?;
        tracing::debug!(fence = %grant.lease.fence(), "lock acquired");
        let hold = Hold::new(self.shared.clone(), holder.clone(), grant, options);
        *slot_guard = Arc::downgrade(&hold);
        self.shared.watchdog.register(&self.shared, &hold);
        Ok(LockGuard::new(hold))
    }

    /// Asks the backend for the lock until it grants a lease that is still valid or the wait
    /// budget runs out. A retryable failure ([`LockError::Unavailable`]: the store is
    /// unreachable) is tried again after a jittered back-off while the budget lasts, and
    /// returned when it has run out, so "the store is down" stays distinct from "the lock is
    /// busy". A grant that arrives already past its local deadline is released in the
    /// background and counts as a busy try. A store that does not answer at all is given up on
    /// [`ANSWER_GRACE`] after the budget (a retry: [`RETRY_GRACE`]).
    async fn grant(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let backend = &self.shared.backend;
        let mut delays = request.backoff().delays();
        // The first try may answer up to ANSWER_GRACE after the budget; a retry, RETRY_GRACE,
        // and when it is cut the failure it retried is the answer.
        let mut cut = request.deadline() + ANSWER_GRACE;
        let mut last: Option<LockError> = None;
        loop {
            let answer = match tokio::time::timeout_at(cut.into(), backend.acquire(request)).await
            {
                Ok(answer) => answer,
                Err(_) => Err(last.take().unwrap_or_else(|| LockError::Unavailable {
                    message: format!(
                        "the store did not answer within the wait budget of {:?} and {ANSWER_GRACE:?} more",
                        request.wait()
                    ),
                    source: None,
                })),
            };
            let error = match answer {
                Ok(grant) if !grant.is_past_deadline() => return Ok(grant),
                Ok(grant) => {
                    tracing::debug!(fence = %grant.lease.fence(), "lock granted too late to use");
                    let backend = backend.clone();
                    tokio::spawn(async move {
                        let _ = backend.release(&grant.lease).await;
                    });
                    request.timeout_error()
                }
                Err(error @ LockError::Unavailable { .. }) => error,
                Err(error) => {
                    tracing::debug!(%error, "lock not acquired");
                    return Err(error);
                }
            };
            let now = Instant::now();
            if now >= request.deadline() {
                tracing::debug!(%error, "lock not acquired");
                return Err(error);
            }
            let delay = delays.next().unwrap_or(request.backoff().max);
            tracing::debug!(%error, ?delay, "acquire failed; retrying within the wait budget");
            last = Some(error);
            cut = request.deadline() + RETRY_GRACE;
            tokio::time::sleep_until((now + delay).min(request.deadline()).into()).await;
        }
    }

    /// One try: the guard, or `None` when another holder has the lock.
    ///
    /// # Errors
    /// As [`LockClient::acquire`], except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    /// As [`LockClient::acquire`].
    pub async fn try_acquire(
        &self,
        holder: &Holder,
        name: &LockName,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let options = options.clone().wait(Duration::ZERO);
        match self.acquire(holder, name, &options).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Who holds `name`, its fence and remaining time; `None` when free.
    ///
    /// # Errors
    /// The backend's errors.
    pub async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.shared.backend.inspect(name).await
    }

    /// Renews a lease obtained elsewhere (for example deserialized from another process, on a
    /// backend with [`portable_lease`](Capabilities::portable_lease)).
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the lease is not current (nothing changes),
    /// [`LockError::InvalidOptions`] for a TTL out of range.
    pub async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LockError> {
        crate::validate_ttl(ttl)?;
        Ok(self.shared.backend.renew(lease, ttl).await?.lease)
    }

    /// Releases a lease obtained elsewhere (see [`LockClient::renew_lease`]).
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the lease is not current (nothing changes).
    pub async fn release_lease(&self, lease: &Lease) -> Result<(), LockError> {
        self.shared.backend.release(lease).await
    }
}

/// How long after the wait budget `acquire` still waits for the store's answer to a try it
/// started in time; then the try is dropped (cancel safe: nothing stays held beyond its TTL)
/// and `acquire` reports [`LockError::Unavailable`]. Whatever the store does, `acquire`
/// returns within the budget plus this.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// How long after the wait budget a retry after a retryable failure may still answer.
const RETRY_GRACE: Duration = Duration::from_millis(50);

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.shared.backend)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    /// A holder keeps a slot per name only while it holds or waits for that name: failed,
    /// timed-out and cancelled acquisitions leave nothing behind.
    #[tokio::test]
    async fn holders_keep_no_slot_for_locks_they_do_not_hold() {
        let client = LockClient::new(MemoryBackend::new());
        let (owner, prober) = (Holder::new(), Holder::new());
        let options = LockOptions::new().ttl(Duration::from_secs(30));
        let mut guards = Vec::new();
        for i in 0..50 {
            let name = LockName::new(format!("slot/{i}")).unwrap();
            guards.push(client.acquire(&owner, &name, &options).await.unwrap());
            assert!(
                client
                    .try_acquire(&prober, &name, &options)
                    .await
                    .unwrap()
                    .is_none()
            );
        }
        assert_eq!(prober.slot_count(), 0, "failed tries left slots");
        let (busy, waiting_options) = (
            LockName::new("slot/0").unwrap(),
            options.clone().wait(Duration::from_secs(10)),
        );
        let waiting = client.acquire(&prober, &busy, &waiting_options);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), waiting)
                .await
                .is_err()
        );
        assert_eq!(
            prober.slot_count(),
            0,
            "a cancelled acquisition left its slot"
        );
        assert_eq!(
            owner.slot_count(),
            50,
            "held locks must keep their slots for reentrancy"
        );
        for guard in guards {
            guard.release().await.unwrap();
        }
        assert_eq!(owner.slot_count(), 0, "released locks left slots");
    }
}
