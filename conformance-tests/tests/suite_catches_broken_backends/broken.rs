//! Deliberately broken wrappers of `MemoryBackend`, one contract violation each.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use async_trait::async_trait;
use conformance_tests::{MemoryStore, TestStore, Unreachable};
use lock_core::{
    Capabilities, Fence, Lease, LockBackend, LockClient, LockError, LockInfo, LockName,
    LockOptions, MAX_TTL, MemoryBackend, WaitOrder,
    backend::{AcquireRequest, Grant},
};

/// How late [`Fault::ValidFromAfterReply`] takes its `valid_from`.
const REPLY_LATE: Duration = Duration::from_millis(50);

/// The violation a wrapper commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Release deletes whatever lease the name has, whoever owns it.
    IgnoresOwnerOnRelease,
    /// Leases never expire (the store keeps them for 24 h).
    NeverExpires,
    /// Every acquisition gets fence 1.
    ReusesFences,
    /// A waiter is never woken by a release; it tries again only at the end of its budget.
    LosesWakeups,
    /// Renew always answers "renewed", even for a lease the store no longer has.
    ReportsLostAsHeld,
    /// Acquire takes the lock from its holder instead of waiting.
    GrantsEveryone,
    /// Grants and renewals report the instant the reply arrived as `valid_from` (50 ms after
    /// the request was sent), so the local deadline ends after the store's expiry.
    ValidFromAfterReply,
    /// A zero wait budget waits 200 ms for the holder before its one try.
    ZeroBudgetWaits,
    /// Every renewal costs a 1 ms round trip, and `renew_many` renews one by one.
    RenewsOneByOne,
    /// Declares FIFO wait order but serves the waiter that came last first.
    ClaimsFifoServesLast,
    /// While the store is down, answers with a non-retryable error, so nobody retries.
    OutageIsFinal,
    /// Declares leases bound to the client (not portable), refuses leases of names it does not
    /// hold without asking the store, and renews or releases a name it holds whatever token
    /// the lease carries.
    SessionIgnoresToken,
}

impl Fault {
    pub(crate) const ALL: [Fault; 12] = [
        Fault::IgnoresOwnerOnRelease,
        Fault::NeverExpires,
        Fault::ReusesFences,
        Fault::LosesWakeups,
        Fault::ReportsLostAsHeld,
        Fault::GrantsEveryone,
        Fault::ValidFromAfterReply,
        Fault::ZeroBudgetWaits,
        Fault::RenewsOneByOne,
        Fault::ClaimsFifoServesLast,
        Fault::OutageIsFinal,
        Fault::SessionIgnoresToken,
    ];

    /// Scenarios that must fail for the fault to count as caught (each one must).
    pub(crate) fn caught_by(self) -> &'static [&'static str] {
        match self {
            Fault::IgnoresOwnerOnRelease => &[
                "ownership/forged_release_changes_nothing",
                "ownership/late_release_keeps_new_holder",
            ],
            Fault::NeverExpires => &[
                "expiry/frees_lock_without_cleanup",
                "fencing/increase_across_expiry",
            ],
            Fault::ReusesFences => &[
                "fencing/increase_across_holders",
                "fencing/increase_across_expiry",
                "fencing/increase_after_revoke",
            ],
            Fault::LosesWakeups => &["waiting/release_wakes_waiter_promptly"],
            Fault::ReportsLostAsHeld => &["lost/fires_when_taken_away"],
            Fault::GrantsEveryone => &[
                "exclusion/try_acquire_excludes",
                "exclusion/contention_loses_no_update",
            ],
            Fault::ValidFromAfterReply => &["lost/fires_at_local_deadline"],
            Fault::ZeroBudgetWaits => &["waiting/zero_budget_is_one_try"],
            Fault::RenewsOneByOne => &["watchdog/batches_renewals"],
            Fault::ClaimsFifoServesLast => &[
                "waiting/fifo_order_where_declared",
                "waiting/no_client_starves",
            ],
            Fault::OutageIsFinal => &["outage/retried_within_budget"],
            Fault::SessionIgnoresToken => &[
                "ownership/forged_release_changes_nothing",
                "ownership/forged_renew_changes_nothing",
            ],
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Broken {
    inner: MemoryBackend,
    fault: Fault,
    /// Waiters of [`Fault::ClaimsFifoServesLast`], in arrival order (shared by every client).
    stack: Arc<Stack>,
    /// The memory store's simulated outage.
    down: Arc<AtomicBool>,
    /// The names this client holds, with their real leases ([`Fault::SessionIgnoresToken`]).
    session: Arc<Mutex<Vec<Lease>>>,
}

/// A last-come-first-served queue of waiting tickets.
#[derive(Debug, Default)]
pub(crate) struct Stack {
    tickets: Mutex<Vec<u64>>,
    changed: Notify,
}

impl Stack {
    fn push(&self) -> u64 {
        let ticket = rand::random();
        self.tickets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ticket);
        ticket
    }

    fn is_top(&self, ticket: u64) -> bool {
        self.tickets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            == Some(&ticket)
    }

    fn remove(&self, ticket: u64) {
        self.tickets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|t| *t != ticket);
        self.changed.notify_waiters();
    }
}

/// Removes a ticket from the stack however the acquisition ends.
struct Ticket<'a> {
    stack: &'a Stack,
    ticket: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.stack.remove(self.ticket);
    }
}

impl Broken {
    fn with_fence(grant: Grant, fence: u64) -> Grant {
        let lease = &grant.lease;
        let mut forged = Lease::new(
            lease.name().clone(),
            lease.token().clone(),
            Fence::new(fence),
            lease.ttl(),
        );
        if let Some(at) = lease.expires_at() {
            forged = forged.with_expires_at(at);
        }
        Grant::new(forged, grant.valid_from)
    }

    /// This client's real lease of `lease`'s name, found by name alone
    /// ([`Fault::SessionIgnoresToken`]); `NotHeld` without asking the store when it has none.
    fn held_by_name(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .rev()
            .find(|held| held.name() == lease.name())
            .cloned()
            .ok_or_else(|| LockError::not_held(lease.name()))
    }

    /// Waits as a stack: only the newest waiter may try, polling every 5 ms.
    async fn serve_last(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let once = Self::one_try(request, request.ttl())?;
        let ticket = Ticket {
            stack: &self.stack,
            ticket: self.stack.push(),
        };
        loop {
            let changed = self.stack.changed.notified();
            if self.stack.is_top(ticket.ticket) {
                match self.inner.acquire(&once).await {
                    Err(LockError::Timeout { .. }) => {}
                    other => return other,
                }
            }
            if Instant::now() >= request.deadline() {
                return Err(request.timeout_error());
            }
            let _ = tokio::time::timeout(Duration::from_millis(5), changed).await;
        }
    }

    fn one_try(request: &AcquireRequest, ttl: Duration) -> Result<AcquireRequest, LockError> {
        let options = LockOptions::new()
            .ttl(ttl)
            .wait(Duration::ZERO)
            .backoff(request.backoff().clone());
        AcquireRequest::new(request.name().clone(), &options)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LockBackend for Broken {
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.fault == Fault::ClaimsFifoServesLast {
            caps.order = WaitOrder::Fifo;
        }
        if self.fault == Fault::SessionIgnoresToken {
            caps.portable_lease = false;
        }
        caps
    }

    fn store(&self) -> &'static str {
        self.inner.store()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(if self.fault == Fault::OutageIsFinal {
                LockError::backend_msg("the store is down")
            } else {
                Unreachable::error()
            });
        }
        match self.fault {
            Fault::NeverExpires => {
                let options = LockOptions::new().ttl(MAX_TTL).wait(request.wait());
                let long = AcquireRequest::new(request.name().clone(), &options)?;
                let grant = self.inner.acquire(&long).await?;
                Ok(Grant::new(
                    grant.lease.with_ttl(request.ttl()),
                    grant.valid_from,
                ))
            }
            Fault::ReusesFences => Ok(Self::with_fence(self.inner.acquire(request).await?, 1)),
            Fault::LosesWakeups => {
                let once = Self::one_try(request, request.ttl())?;
                match self.inner.acquire(&once).await {
                    Err(LockError::Timeout { .. }) if !request.wait().is_zero() => {
                        tokio::time::sleep_until(request.deadline().into()).await;
                        self.inner
                            .acquire(&once)
                            .await
                            .map_err(|_| request.timeout_error())
                    }
                    other => other,
                }
            }
            Fault::GrantsEveryone => {
                self.inner.evict(request.name());
                self.inner.acquire(request).await
            }
            Fault::ValidFromAfterReply => {
                let grant = self.inner.acquire(request).await?;
                tokio::time::sleep(REPLY_LATE).await;
                Ok(Grant::new(grant.lease, Instant::now()))
            }
            Fault::ZeroBudgetWaits if request.wait().is_zero() => {
                match self.inner.acquire(request).await {
                    Err(LockError::Timeout { .. }) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        self.inner.acquire(request).await
                    }
                    other => other,
                }
            }
            Fault::ClaimsFifoServesLast if !request.wait().is_zero() => {
                self.serve_last(request).await
            }
            Fault::SessionIgnoresToken => {
                let grant = self.inner.acquire(request).await?;
                self.session
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(grant.lease.clone());
                Ok(grant)
            }
            Fault::IgnoresOwnerOnRelease
            | Fault::ClaimsFifoServesLast
            | Fault::OutageIsFinal
            | Fault::ReportsLostAsHeld
            | Fault::ZeroBudgetWaits
            | Fault::RenewsOneByOne => self.inner.acquire(request).await,
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        match self.fault {
            Fault::NeverExpires => {
                let grant = self.inner.renew(lease, MAX_TTL).await?;
                Ok(Grant::new(grant.lease.with_ttl(ttl), grant.valid_from))
            }
            Fault::ReportsLostAsHeld => Ok(Grant::new(lease.clone().with_ttl(ttl), Instant::now())),
            Fault::ValidFromAfterReply => {
                let grant = self.inner.renew(lease, ttl).await?;
                tokio::time::sleep(REPLY_LATE).await;
                Ok(Grant::new(grant.lease, Instant::now()))
            }
            Fault::RenewsOneByOne => {
                tokio::time::sleep(Duration::from_millis(1)).await;
                self.inner.renew(lease, ttl).await
            }
            Fault::SessionIgnoresToken => {
                let real = self.held_by_name(lease)?;
                self.inner.renew(&real, ttl).await
            }
            _ => self.inner.renew(lease, ttl).await,
        }
    }

    /// One by one through [`Broken::renew`], so every fault of a renewal applies to batches
    /// too (and `RenewsOneByOne` is what it says).
    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        lock_core::backend::renew_one_by_one(self, leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        match self.fault {
            Fault::IgnoresOwnerOnRelease => {
                self.inner.evict(lease.name());
                Ok(())
            }
            Fault::SessionIgnoresToken => {
                let real = self.held_by_name(lease)?;
                self.inner.release(&real).await
            }
            _ => self.inner.release(lease).await,
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(name).await
    }
}

/// A [`TestStore`] over one broken wrapper: the fault tools are the memory store's.
#[derive(Debug, Clone)]
pub(crate) struct BrokenStore {
    memory: MemoryStore,
    fault: Fault,
    stack: Arc<Stack>,
}

impl BrokenStore {
    pub(crate) fn new(fault: Fault) -> Self {
        Self {
            memory: MemoryStore::new(),
            fault,
            stack: Arc::default(),
        }
    }
}

#[async_trait]
impl TestStore for BrokenStore {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(Broken {
            inner: self.memory.backend().clone(),
            fault: self.fault,
            stack: self.stack.clone(),
            down: self.memory.outage_switch(),
            session: Arc::default(),
        }))
    }

    async fn revoke(&self, name: &LockName) -> Result<(), LockError> {
        self.memory.revoke(name).await
    }

    async fn admin(&self) -> Result<Arc<dyn lock_core::LockAdmin>, LockError> {
        // The operator's view of the store underneath: every fault is in the clients.
        self.memory.admin().await
    }

    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError> {
        self.memory.leftovers(name).await
    }

    fn cross_process(&self) -> bool {
        self.memory.cross_process()
    }

    fn ttl(&self) -> Duration {
        self.memory.ttl()
    }

    async fn begin_outage(&self) -> Result<(), LockError> {
        self.memory.begin_outage().await
    }

    async fn end_outage(&self) -> Result<(), LockError> {
        self.memory.end_outage().await
    }

    fn can_fail(&self) -> Result<(), &'static str> {
        self.memory.can_fail()
    }
}
