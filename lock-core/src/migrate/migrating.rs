//! [`MigratingBackend`]: a backend over the store locks move from and the one they move to,
//! in one [`Phase`] (see the module's docs).

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use async_trait::async_trait;

use super::{
    fence::encode,
    record::{Authority, MigrationRecord},
};
use crate::{
    Capabilities, Clock, Expiry, Failover, Fencing, Lease, LockError, LockInfo, LockName,
    WaitOrder, Wakeup,
    backend::{AcquireRequest, EndSignal, Grant, LeaseToken, LockBackend, end_signal},
};

/// Which stores a client locks in (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `from` only, before the migration (or while it has not reached this client).
    Old,
    /// Both: `from`, then `to`.
    Dual,
    /// `to` only, once the record's authority is `to`.
    New,
}

/// The inner leases of one hold.
#[derive(Debug, Clone)]
struct Pair {
    from: Option<Lease>,
    to: Option<Lease>,
}

/// A lock taken on one side, given back when dropped before it joins a hold (a failed or
/// dropped dual acquisition).
struct Taken {
    backend: Arc<dyn LockBackend>,
    lease: Option<Lease>,
}

impl Taken {
    fn new(backend: &Arc<dyn LockBackend>, lease: &Lease) -> Self {
        Self {
            backend: backend.clone(),
            lease: Some(lease.clone()),
        }
    }

    fn keep(mut self) {
        self.lease = None;
    }

    async fn give_back(mut self) {
        if let Some(lease) = self.lease.take() {
            let _ = self.backend.release(&lease).await;
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let (Some(lease), Ok(runtime)) =
            (self.lease.take(), tokio::runtime::Handle::try_current())
        {
            let backend = self.backend.clone();
            runtime.spawn(async move {
                let _ = backend.release(&lease).await;
            });
        }
    }
}

/// Locks over two stores during a migration between them.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::{
///     LockClient, MemoryBackend,
///     migrate::{Authority, MemoryRecord, MigratingBackend, MigrationRecord, Phase, Record},
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let (from, to) = (Arc::new(MemoryBackend::new()), Arc::new(MemoryBackend::new()));
/// let record = Arc::new(MemoryRecord::new(0));
/// let dual = LockClient::new(
///     MigratingBackend::new(from.clone(), to.clone(), record.clone(), Phase::Dual).await?,
/// );
/// let before = dual.lock("jobs/a").await?;
/// let fence_before = before.fence();
/// before.release().await?;
/// // The operator flips authority to the new store: fences move to the next generation.
/// let now = record.read().await?;
/// record.advance(&now, &Record { authority: Authority::To, ..now }).await?;
/// let after = dual.lock("jobs/a").await?;
/// assert!(after.fence() > fence_before);
/// after.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct MigratingBackend {
    from: Arc<dyn LockBackend>,
    to: Arc<dyn LockBackend>,
    record: Arc<dyn MigrationRecord>,
    phase: Phase,
    /// The fence generation of an `old` (the record's) or `new` (one above) client.
    generation: u64,
    held: Mutex<HashMap<LeaseToken, Pair>>,
}

impl fmt::Debug for MigratingBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigratingBackend")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("phase", &self.phase)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

fn weaker_fencing(a: Fencing, b: Fencing) -> Fencing {
    if a == Fencing::Strict && b == Fencing::Strict {
        Fencing::Strict
    } else {
        Fencing::BestEffort
    }
}

fn weaker_order(a: WaitOrder, b: WaitOrder) -> WaitOrder {
    match (a, b) {
        (WaitOrder::Fifo, WaitOrder::Fifo) => WaitOrder::Fifo,
        (WaitOrder::Fifo | WaitOrder::Fair, WaitOrder::Fifo | WaitOrder::Fair) => WaitOrder::Fair,
        _ => WaitOrder::None,
    }
}

fn weaker_clock(a: Clock, b: Clock) -> Clock {
    if a == Clock::Client || b == Clock::Client {
        Clock::Client
    } else if a == Clock::Server || b == Clock::Server {
        Clock::Server
    } else {
        Clock::None
    }
}

fn weaker_failover(a: Failover, b: Failover) -> Failover {
    let rank = |f: Failover| match f {
        Failover::AsyncReplica => 0,
        Failover::SingleServer => 1,
        _ => 2,
    };
    if rank(a) <= rank(b) { a } else { b }
}

/// The weaker of two stores' capabilities, property by property.
fn weaker(a: &Capabilities, b: &Capabilities) -> Capabilities {
    let both = |x: bool, y: bool| x && y;
    Capabilities::new(
        weaker_fencing(a.fencing, b.fencing),
        if a.expiry == Expiry::Ttl && b.expiry == Expiry::Ttl {
            Expiry::Ttl
        } else {
            Expiry::Session
        },
        if a.wakeup == Wakeup::Push && b.wakeup == Wakeup::Push {
            Wakeup::Push
        } else {
            Wakeup::Poll
        },
        weaker_order(a.order, b.order),
        weaker_clock(a.clock, b.clock),
    )
    .with_portable_lease(false)
    .with_failover(weaker_failover(a.failover, b.failover))
    .with_replica_acks(a.replica_acks.min(b.replica_acks))
    .with_batched_renewals(both(a.batched_renewals, b.batched_renewals))
}

/// The end signal of a hold over two grants: ends when either side's does.
fn either_end(a: Option<&EndSignal>, b: Option<&EndSignal>) -> Option<EndSignal> {
    match (a.cloned(), b.cloned()) {
        (None, None) => None,
        (Some(one), None) | (None, Some(one)) => Some(one),
        (Some(a), Some(b)) => {
            let (notifier, signal) = end_signal();
            tokio::spawn(async move {
                let reason = tokio::select! {
                    reason = a.ended() => reason,
                    reason = b.ended() => reason,
                    () = notifier_closed(&notifier) => return,
                };
                notifier.end(reason);
            });
            Some(signal)
        }
    }
}

/// Resolves once nobody listens to `notifier` any more (checked now and then).
async fn notifier_closed(notifier: &crate::backend::EndNotifier) {
    while !notifier.is_closed() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl MigratingBackend {
    /// A backend in `phase` over `from` and `to`, with the migration's `record`.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for an `old` client once authority has moved to `to`,
    /// or a `new` client before it has (a fleet must never run `old` and `new` together);
    /// the record's read failing.
    pub async fn new(
        from: Arc<dyn LockBackend>,
        to: Arc<dyn LockBackend>,
        record: Arc<dyn MigrationRecord>,
        phase: Phase,
    ) -> Result<Self, LockError> {
        let now = record.read().await?;
        let generation = match (phase, now.authority) {
            (Phase::New, Authority::From) => {
                return Err(LockError::invalid_options(
                    "a `new` client cannot start before the migration's flip: authority is \
                     still with the store locks move from (run `dual` clients until then)",
                ));
            }
            (Phase::Old, Authority::To) => {
                return Err(LockError::invalid_options(
                    "an `old` client cannot start after the migration's flip: `new` clients \
                     may be running, and `old` and `new` would not exclude each other",
                ));
            }
            (Phase::New, Authority::To) => now.generation + 1,
            _ => now.generation,
        };
        Ok(Self {
            from,
            to,
            record,
            phase,
            generation,
            held: Mutex::new(HashMap::new()),
        })
    }

    fn held(&self) -> MutexGuard<'_, HashMap<LeaseToken, Pair>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A hold of one side's `grant`, its fence of `generation`.
    fn single(&self, grant: &Grant, generation: u64, from_side: bool) -> Result<Grant, LockError> {
        let fence = encode(generation, grant.lease.fence())?;
        let token = LeaseToken::random();
        let lease = Lease::new(
            grant.lease.name().clone(),
            token.clone(),
            fence,
            grant.lease.ttl(),
        );
        let pair = if from_side {
            Pair {
                from: Some(grant.lease.clone()),
                to: None,
            }
        } else {
            Pair {
                from: None,
                to: Some(grant.lease.clone()),
            }
        };
        self.held().insert(token, pair);
        let mut out = Grant::new(lease, grant.valid_from);
        if let Some(end) = grant.end() {
            out = out.with_end(end.clone());
        }
        Ok(out)
    }

    async fn acquire_one(
        &self,
        backend: &Arc<dyn LockBackend>,
        request: &AcquireRequest,
        generation: u64,
        from_side: bool,
    ) -> Result<Grant, LockError> {
        let grant = backend.acquire(request).await?;
        let taken = Taken::new(backend, &grant.lease);
        match self.single(&grant, generation, from_side) {
            Ok(out) => {
                taken.keep();
                Ok(out)
            }
            Err(error) => {
                taken.give_back().await;
                Err(error)
            }
        }
    }

    /// Both sides, `from` first; the fence as the record says after both are held.
    async fn acquire_dual(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let from = self.from.acquire(request).await?;
        let from_taken = Taken::new(&self.from, &from.lease);
        let to = match self.to.acquire(&request.remaining()).await {
            Ok(to) => to,
            Err(error) => {
                from_taken.give_back().await;
                return Err(error);
            }
        };
        let to_taken = Taken::new(&self.to, &to.lease);
        let fence = match self.record.read().await {
            Ok(record) => match record.authority {
                Authority::From => encode(record.generation, from.lease.fence()),
                Authority::To => encode(record.generation + 1, to.lease.fence()),
            },
            Err(error) => Err(error),
        };
        let fence = match fence {
            Ok(fence) => fence,
            Err(error) => {
                to_taken.give_back().await;
                from_taken.give_back().await;
                return Err(error);
            }
        };
        let token = LeaseToken::random();
        let ttl = from.lease.ttl().min(to.lease.ttl());
        let lease = Lease::new(request.name().clone(), token.clone(), fence, ttl);
        self.held().insert(
            token,
            Pair {
                from: Some(from.lease.clone()),
                to: Some(to.lease.clone()),
            },
        );
        to_taken.keep();
        from_taken.keep();
        let mut grant = Grant::new(lease, from.valid_from.min(to.valid_from));
        if let Some(end) = either_end(from.end(), to.end()) {
            grant = grant.with_end(end);
        }
        Ok(grant)
    }

    fn pair(&self, lease: &Lease) -> Result<Pair, LockError> {
        self.held()
            .get(lease.token())
            .cloned()
            .ok_or_else(|| LockError::not_held(lease.name()))
    }

    /// The fence `info` (of one side) shows to callers of this backend.
    async fn shown(&self, info: LockInfo, from_side: bool) -> Result<LockInfo, LockError> {
        let generation = match self.phase {
            Phase::Old | Phase::New => self.generation,
            Phase::Dual => {
                let record = self.record.read().await?;
                if from_side {
                    record.generation
                } else {
                    record.generation + 1
                }
            }
        };
        let fence = encode(generation, info.fence)?;
        // A hold of this backend is shown with its own token.
        let token = self
            .held()
            .iter()
            .find(|(_, pair)| {
                let side = if from_side { &pair.from } else { &pair.to };
                side.as_ref().is_some_and(|l| *l.token() == info.token)
            })
            .map_or_else(|| info.token.clone(), |(token, _)| token.clone());
        Ok(LockInfo::new(info.name, token, fence, info.expires_in))
    }
}

#[async_trait]
impl LockBackend for MigratingBackend {
    fn capabilities(&self) -> Capabilities {
        match self.phase {
            Phase::Old => self.from.capabilities().with_portable_lease(false),
            Phase::New => self.to.capabilities().with_portable_lease(false),
            Phase::Dual => weaker(&self.from.capabilities(), &self.to.capabilities()),
        }
    }

    fn store(&self) -> &'static str {
        "migrating"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        match self.phase {
            Phase::Old => {
                self.acquire_one(&self.from, request, self.generation, true)
                    .await
            }
            Phase::New => {
                self.acquire_one(&self.to, request, self.generation, false)
                    .await
            }
            Phase::Dual => self.acquire_dual(request).await,
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        let pair = self.pair(lease)?;
        let renew = |backend: Arc<dyn LockBackend>, inner: Option<Lease>| async move {
            match inner {
                Some(inner) => backend.renew(&inner, ttl).await.map(Some),
                None => Ok(None),
            }
        };
        let (from, to) = futures::join!(
            renew(self.from.clone(), pair.from.clone()),
            renew(self.to.clone(), pair.to.clone())
        );
        let lost = |r: &Result<Option<Grant>, LockError>| {
            matches!(r, Err(LockError::NotHeld { .. } | LockError::Lost { .. }))
        };
        if lost(&from) || lost(&to) {
            // The hold is over: give back the other side now, not at its TTL.
            if let Some(pair) = self.held().remove(lease.token()) {
                for (backend, inner) in [(&self.from, pair.from), (&self.to, pair.to)] {
                    if let Some(inner) = inner {
                        drop(Taken::new(backend, &inner));
                    }
                }
            }
        }
        let (from, to) = (from?, to?);
        let mut valid_from = None;
        let mut renewed_ttl = None;
        if let Some(entry) = self.held().get_mut(lease.token()) {
            for (side, grant) in [(&mut entry.from, &from), (&mut entry.to, &to)] {
                if let Some(grant) = grant {
                    *side = Some(grant.lease.clone());
                    valid_from = Some(
                        valid_from.map_or(grant.valid_from, |v: std::time::Instant| {
                            v.min(grant.valid_from)
                        }),
                    );
                    let t = grant.lease.ttl();
                    renewed_ttl = Some(renewed_ttl.map_or(t, |r: Duration| r.min(t)));
                }
            }
        }
        let (Some(valid_from), Some(ttl)) = (valid_from, renewed_ttl) else {
            return Err(LockError::not_held(lease.name()));
        };
        Ok(Grant::new(lease.clone().with_ttl(ttl), valid_from))
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        crate::backend::renew_concurrently(self, leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let pair = self
            .held()
            .remove(lease.token())
            .ok_or_else(|| LockError::not_held(lease.name()))?;
        // `to` first, then `from`: the reverse of the order they were taken in.
        let to = match &pair.to {
            Some(inner) => self.to.release(inner).await,
            None => Ok(()),
        };
        let from = match &pair.from {
            Some(inner) => self.from.release(inner).await,
            None => Ok(()),
        };
        to.and(from)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        match self.phase {
            Phase::Old => match self.from.inspect(name).await? {
                Some(info) => Ok(Some(self.shown(info, true).await?)),
                None => Ok(None),
            },
            Phase::New => match self.to.inspect(name).await? {
                Some(info) => Ok(Some(self.shown(info, false).await?)),
                None => Ok(None),
            },
            Phase::Dual => {
                let (from, to) = futures::join!(self.from.inspect(name), self.to.inspect(name));
                let (from, to) = (from?, to?);
                let authority = self.record.read().await?.authority;
                // Held when either side is: a split holder is busy, never resolved by time.
                match (from, to, authority) {
                    (Some(info), _, Authority::From) | (Some(info), None, Authority::To) => {
                        Ok(Some(self.shown(info, true).await?))
                    }
                    (_, Some(info), _) => Ok(Some(self.shown(info, false).await?)),
                    (None, None, _) => Ok(None),
                }
            }
        }
    }
}
