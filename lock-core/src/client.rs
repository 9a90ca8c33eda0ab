//! [`LockClient`]: the user-facing entry point over any [`LockBackend`].

use std::{
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::Instrument;

use crate::{
    Capabilities, Holder, IntoLockName, Lease, LockError, LockGuard, LockInfo, LockOptions,
    backend::{AcquireRequest, Grant, LockBackend, validate_ttl},
    hold::Hold,
    reentry::Reentry,
    watchdog::Watchdog,
};

/// A lock client over one backend: acquires guards, counts reentrancy, runs the watchdog, and
/// signals loss. Cheap to clone (clones share the backend, the watchdog and the reentry
/// table; each clone has its own default options).
///
/// Needs a Tokio runtime with timers enabled (the watchdog and the lost signal use them).
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockClient, LockOptions, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let client = LockClient::new(MemoryBackend::new())
///     .with_options(LockOptions::new().ttl(Duration::from_secs(10)));
///
/// let guard = client.lock("reports/daily").await?;
/// // Anyone else is excluded until the guard is released.
/// assert!(client.try_lock("reports/daily").await?.is_none());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// Reentrancy needs a [`Holder`]: the same holder acquiring a name it holds through the same
/// client joins its hold ([`LockClient::acquire`]).
#[derive(Clone)]
pub struct LockClient {
    backend: Arc<dyn LockBackend>,
    watchdog: Arc<Watchdog>,
    reentry: Arc<Reentry>,
    options: LockOptions,
}

impl LockClient {
    /// A client over `backend`, with [`LockOptions::default`] for [`lock`](Self::lock) and
    /// [`try_lock`](Self::try_lock). A shared backend (`Arc<dyn LockBackend>`, a store chosen
    /// at run time) is a backend too.
    pub fn new<B: LockBackend>(backend: B) -> Self {
        // A shared backend is kept as it is (no second `Arc` around it), so `backend()` hands
        // back the very one given.
        let any: &dyn std::any::Any = &backend;
        let backend: Arc<dyn LockBackend> = match any.downcast_ref::<Arc<dyn LockBackend>>() {
            Some(shared) => shared.clone(),
            None => Arc::new(backend),
        };
        Self {
            watchdog: Watchdog::new(backend.clone()),
            backend,
            reentry: Arc::default(),
            options: LockOptions::default(),
        }
    }

    /// This client with `options` as the defaults of [`lock`](Self::lock) and
    /// [`try_lock`](Self::try_lock) (they are checked when a lock is asked for).
    #[must_use]
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The default options of [`lock`](Self::lock) and [`try_lock`](Self::try_lock).
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// What the backend guarantees.
    pub fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    /// Acquires `name` with the client's options, waiting up to their wait budget.
    ///
    /// Each call is its own holder: a second `lock` of a name waits for the first guard like
    /// any other process would. For reentrancy use [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// [`LockError::InvalidName`] and [`LockError::InvalidOptions`] (nothing sent to the
    /// store), [`LockError::Timeout`] when the budget ran out, and the backend's errors
    /// ([`LockError::Unavailable`], [`LockError::Foreign`], ...).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing held beyond the TTL; session stores clean up in the
    /// background.
    pub async fn lock(&self, name: impl IntoLockName) -> Result<LockGuard, LockError> {
        self.lock_with(name, &self.options).await
    }

    /// One try with the client's options: the guard, or `None` when the lock is busy.
    ///
    /// # Errors
    /// As [`LockClient::lock`], except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    /// As [`LockClient::lock`].
    pub async fn try_lock(&self, name: impl IntoLockName) -> Result<Option<LockGuard>, LockError> {
        self.try_lock_with(name, &self.options).await
    }

    /// Acquires `name` with `options` instead of the client's.
    ///
    /// # Errors
    /// As [`LockClient::lock`].
    ///
    /// # Cancel safety
    /// As [`LockClient::lock`].
    pub async fn lock_with(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire(&Holder::new(), name, options).await
    }

    /// One try with `options` instead of the client's.
    ///
    /// # Errors
    /// As [`LockClient::try_lock`].
    ///
    /// # Cancel safety
    /// As [`LockClient::lock`].
    pub async fn try_lock_with(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_acquire(&Holder::new(), name, options).await
    }

    /// Acquires `name` for `holder`, waiting up to `options.wait` (zero: one try).
    ///
    /// If `holder` already holds `name` through this client, this re-enters: it returns
    /// another guard on the same store lease at once (`options` of the first acquisition stay
    /// in force), and the lease is released when every guard is.
    ///
    /// ```
    /// use lock_core::{Holder, LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let (job, options) = (Holder::new(), client.options().clone());
    /// let outer = client.acquire(&job, "invoices/7", &options).await?;
    /// let inner = client.acquire(&job, "invoices/7", &options).await?; // re-enters
    /// assert_eq!(inner.fence(), outer.fence());
    /// inner.release().await?;
    /// outer.release().await?; // the store lease ends here
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`LockClient::lock`].
    ///
    /// # Cancel safety
    /// As [`LockClient::lock`].
    pub async fn acquire(
        &self,
        holder: &Holder,
        name: impl IntoLockName,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let name = name.into_lock_name()?;
        let request = AcquireRequest::new(name, options)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LockError::unsupported(
                "acquiring outside a Tokio runtime (lock-core's watchdog needs one)",
            ));
        }
        let span = tracing::debug_span!(
            "lock.acquire",
            lock = %request.name(),
            holder = %holder.id(),
            store = self.backend.store(),
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let started = request.started();
        let result = self
            .acquire_inner(holder, request, options)
            .instrument(span.clone())
            .await;
        span.record(
            "waited_ms",
            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        );
        span.record("outcome", outcome(&result));
        result
    }

    async fn acquire_inner(
        &self,
        holder: &Holder,
        request: AcquireRequest,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let slot_use = self.reentry.enter(holder.id(), request.name());
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
            return Ok(LockGuard::new(hold, self.reentry.clone()));
        }
        let grant = self.grant(&request).await?;
        tracing::debug!(fence = %grant.lease.fence(), "lock acquired");
        let hold = Hold::new(
            self.backend.clone(),
            self.watchdog.waker(),
            holder.clone(),
            grant,
            options,
        );
        *slot_guard = Arc::downgrade(&hold);
        self.watchdog.register(&hold);
        Ok(LockGuard::new(hold, self.reentry.clone()))
    }

    /// Asks the backend for the lock until it grants a lease that is still valid or the wait
    /// budget runs out. A retryable failure ([`LockError::Unavailable`]: the store is
    /// unreachable) is tried again after a jittered back-off while the budget lasts, and
    /// returned when it has run out, so "the store is down" stays distinct from "the lock is
    /// busy". A grant that arrives already past its local deadline is released in the
    /// background and counts as a busy try. A store that does not answer at all is given up on
    /// [`ANSWER_GRACE`] after the budget (a retry: [`RETRY_GRACE`]).
    async fn grant(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let backend = &self.backend;
        let mut delays = request.backoff().delays();
        // The first try may answer up to ANSWER_GRACE after the budget; a retry, RETRY_GRACE,
        // and when it is cut the failure it retried is the answer.
        let mut cut = request.deadline() + ANSWER_GRACE;
        let mut last: Option<LockError> = None;
        loop {
            let answer = match tokio::time::timeout_at(cut.into(), backend.acquire(request)).await
            {
                Ok(answer) => answer,
                Err(_) => Err(last.take().unwrap_or_else(|| LockError::unavailable_msg(format!(
                        "the store did not answer within the wait budget of {:?} and {ANSWER_GRACE:?} more",
                        request.wait()
                    )))),
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
        name: impl IntoLockName,
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
    ///
    /// The answer is observability, not a pre-check: the lock may be taken or freed the moment
    /// after it is read. To act only when free, use [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// A read: dropping the future changes nothing.
    pub async fn inspect(&self, name: impl IntoLockName) -> Result<Option<LockInfo>, LockError> {
        self.backend.inspect(&name.into_lock_name()?).await
    }

    /// Renews a lease obtained elsewhere (for example deserialized from another process, on a
    /// backend with [`portable_lease`](Capabilities::portable_lease)).
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the lease is not current (nothing changes),
    /// [`LockError::InvalidOptions`] for a TTL out of range.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have renewed the lease.
    pub async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LockError> {
        validate_ttl(ttl)?;
        Ok(self.backend.renew(lease, ttl).await?.lease)
    }

    /// Releases a lease obtained elsewhere (see [`LockClient::renew_lease`]).
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the lease is not current (nothing changes).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have released the lease; it ends at its TTL either
    /// way.
    pub async fn release_lease(&self, lease: &Lease) -> Result<(), LockError> {
        self.backend.release(lease).await
    }
}

/// How long after the wait budget `acquire` still waits for the store's answer to a try it
/// started in time; then the try is dropped (cancel safe: nothing stays held beyond its TTL)
/// and `acquire` reports [`LockError::Unavailable`]. Whatever the store does, `acquire`
/// returns within the budget plus this.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// How long after the wait budget a retry after a retryable failure may still answer.
const RETRY_GRACE: Duration = Duration::from_millis(50);

/// How an acquisition ended, for spans and metrics: `acquired`, `timeout` or `error`.
pub(crate) fn outcome<T>(result: &Result<T, LockError>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(_) => "error",
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.backend)
            .field("options", &self.options)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockName, MemoryBackend};

    /// A shared backend is used as it is, not wrapped again.
    #[test]
    fn a_shared_backend_is_not_wrapped_again() {
        let shared: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let client = LockClient::new(shared.clone());
        assert!(Arc::ptr_eq(client.backend(), &shared));
    }

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
        assert_eq!(
            client.reentry.count(prober.id()),
            0,
            "failed tries left slots"
        );
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
            client.reentry.count(prober.id()),
            0,
            "a cancelled acquisition left its slot"
        );
        assert_eq!(
            client.reentry.count(owner.id()),
            50,
            "held locks must keep their slots for reentrancy"
        );
        for guard in guards {
            guard.release().await.unwrap();
        }
        assert_eq!(
            client.reentry.count(owner.id()),
            0,
            "released locks left slots"
        );
    }
}
