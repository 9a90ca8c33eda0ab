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
    backend::{AcquireRequest, EndSignal, Grant, LeaseToken, LockBackend},
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

/// The inner leases of one hold, and the fence it was granted with.
#[derive(Debug, Clone)]
struct Pair {
    from: Option<Lease>,
    to: Option<Lease>,
    fence: crate::Fence,
    /// Told when the hold leaves the map by a release or a lost renewal, so the task
    /// watching its end signal stops.
    done: Arc<tokio::sync::Notify>,
}

/// The holds of a backend, by the token it gave them.
type Held = Arc<Mutex<HashMap<LeaseToken, Pair>>>;

fn lock_held(held: &Held) -> MutexGuard<'_, HashMap<LeaseToken, Pair>> {
    held.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// Releases now, on a task of its own: a caller that stops waiting (its future dropped)
    /// does not stop the release.
    async fn give_back(mut self) {
        if let Some(lease) = self.lease.take() {
            let backend = self.backend.clone();
            let _ = tokio::spawn(async move { backend.release(&lease).await }).await;
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
    held: Held,
    /// The latest record this backend has read: one that reads older is refused (a record
    /// store that lost its write must not send fences back).
    seen: Mutex<super::record::Record>,
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
    .with_batched_renewals(a.batched_renewals && b.batched_renewals)
}

/// The end signal of a hold over two grants: ends when either side's does.
fn either_end(a: Option<&EndSignal>, b: Option<&EndSignal>) -> Option<EndSignal> {
    match (a, b) {
        (None, None) => None,
        (Some(one), None) | (None, Some(one)) => Some(one.clone()),
        (Some(a), Some(b)) => Some(EndSignal::any(a, b)),
    }
}

/// Watches the end signal of the hold `token`: once the store ends it (lock-core then
/// releases nothing), the hold leaves the map and what is left of it on the other store is
/// given back. Stops when the hold leaves the map otherwise.
fn watch_end(
    held: Held,
    from: Arc<dyn LockBackend>,
    to: Arc<dyn LockBackend>,
    token: LeaseToken,
    end: EndSignal,
    done: Arc<tokio::sync::Notify>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        tokio::select! {
            _ = end.ended() => {}
            () = done.notified() => return,
        }
        let Some(pair) = lock_held(&held).remove(&token) else {
            return;
        };
        for (backend, inner) in [(from, pair.from), (to, pair.to)] {
            if let Some(inner) = inner {
                let _ = backend.release(&inner).await;
            }
        }
    });
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
            held: Arc::default(),
            seen: Mutex::new(now),
        })
    }

    fn held(&self) -> MutexGuard<'_, HashMap<LeaseToken, Pair>> {
        lock_held(&self.held)
    }

    /// The record now, refused when it reads older than one read before.
    async fn record_now(&self) -> Result<super::record::Record, LockError> {
        let now = self.record.read().await?;
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.precedes(&now) {
            *seen = now;
        } else if now != *seen {
            return Err(LockError::backend_msg(format!(
                "the migration record went back from {:?} to {now:?}: its store lost a write \
                 (restarted without persistence?); no lock is granted on it",
                *seen
            )));
        }
        Ok(now)
    }

    /// Puts a new hold in the map, watching its end signal.
    fn insert(
        &self,
        token: LeaseToken,
        from: Option<Lease>,
        to: Option<Lease>,
        fence: crate::Fence,
        end: Option<&EndSignal>,
    ) {
        let done = Arc::new(tokio::sync::Notify::new());
        self.held().insert(
            token.clone(),
            Pair {
                from,
                to,
                fence,
                done: done.clone(),
            },
        );
        if let Some(end) = end {
            watch_end(
                self.held.clone(),
                self.from.clone(),
                self.to.clone(),
                token,
                end.clone(),
                done,
            );
        }
    }

    /// Takes a hold out of the map (a release, a lost renewal): its watcher stops.
    fn take(&self, token: &LeaseToken) -> Option<Pair> {
        let pair = self.held().remove(token);
        if let Some(pair) = &pair {
            pair.done.notify_one();
        }
        pair
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
        let (from, to) = if from_side {
            (Some(grant.lease.clone()), None)
        } else {
            (None, Some(grant.lease.clone()))
        };
        self.insert(token, from, to, fence, grant.end());
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
        if self.phase == Phase::Old {
            // Read after the lock is held, so an `old` client never holds across a flip it
            // could have seen: after the flip it takes nothing any more.
            let flipped = match self.record_now().await {
                Ok(record) => record.authority == Authority::To,
                Err(error) => {
                    taken.give_back().await;
                    return Err(error);
                }
            };
            if flipped {
                taken.give_back().await;
                return Err(LockError::invalid_options(
                    "the migration has flipped: an `old` client takes no lock any more \
                     (deploy `dual` or `new`)",
                ));
            }
        }
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
        let fence = match self.record_now().await {
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
        let end = either_end(from.end(), to.end());
        self.insert(
            token,
            Some(from.lease.clone()),
            Some(to.lease.clone()),
            fence,
            end.as_ref(),
        );
        to_taken.keep();
        from_taken.keep();
        let mut grant = Grant::new(lease, from.valid_from.min(to.valid_from));
        if let Some(end) = end {
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

    /// How `info` (of one side; the authority's `generation`) shows to callers of this
    /// backend: a hold of this backend with its own token and the fence it was granted with;
    /// another's with that side's fence in `generation`.
    fn shown(
        &self,
        info: LockInfo,
        from_side: bool,
        generation: u64,
    ) -> Result<LockInfo, LockError> {
        let own = self
            .held()
            .iter()
            .find(|(_, pair)| {
                let side = if from_side { &pair.from } else { &pair.to };
                side.as_ref().is_some_and(|l| *l.token() == info.token)
            })
            .map(|(token, pair)| (token.clone(), pair.fence));
        let (token, fence) = match own {
            Some(own) => own,
            None => (info.token.clone(), encode(generation, info.fence)?),
        };
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
            matches!(
                r,
                Err(LockError::NotHeld { .. } | LockError::Lost { .. } | LockError::Foreign { .. })
            )
        };
        if lost(&from) || lost(&to) {
            // The hold is over: give back the other side now, not at its TTL, and answer
            // the loss (not another side's outage, which lock-core would only retry).
            if let Some(pair) = self.take(lease.token()) {
                for (backend, inner) in [(&self.from, pair.from), (&self.to, pair.to)] {
                    if let Some(inner) = inner {
                        drop(Taken::new(backend, &inner));
                    }
                }
            }
            let (first, second) = if lost(&from) { (from, to) } else { (to, from) };
            first?;
            second?;
            return Err(LockError::not_held(lease.name()));
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
            .take(lease.token())
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
                Some(info) => Ok(Some(self.shown(info, true, self.generation)?)),
                None => Ok(None),
            },
            Phase::New => match self.to.inspect(name).await? {
                Some(info) => Ok(Some(self.shown(info, false, self.generation)?)),
                None => Ok(None),
            },
            Phase::Dual => {
                let (from, to) = futures::join!(self.from.inspect(name), self.to.inspect(name));
                let (from, to) = (from?, to?);
                let record = self.record_now().await?;
                let left = [&from, &to]
                    .into_iter()
                    .flatten()
                    .filter_map(|info| info.expires_in)
                    .min();
                // Held when either side is: a split holder is busy, never resolved by time.
                let shown = match (from, to, record.authority) {
                    (Some(info), _, Authority::From) | (Some(info), None, Authority::To) => {
                        self.shown(info, true, record.generation)?
                    }
                    (_, Some(info), _) => self.shown(info, false, record.generation + 1)?,
                    (None, None, _) => return Ok(None),
                };
                Ok(Some(LockInfo::new(
                    shown.name,
                    shown.token,
                    shown.fence,
                    left,
                )))
            }
        }
    }
}
