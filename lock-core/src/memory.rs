//! [`MemoryBackend`]: the complete in-process reference implementation of the contract.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::{
    Capabilities, Clock, Expiry, Failover, Fence, Fencing, Forced, HeldLock, Lease, LockAdmin,
    LockError, LockInfo, LockName, WaitOrder, Wakeup,
    backend::{AcquireRequest, Grant, LeaseToken, LockBackend},
};

/// An in-process lock store: every rule of the contract, no server.
///
/// It is the reference the conformance suite is checked against and the default in examples.
/// Waiters are woken by release notifications (no polling) or when the holder's TTL runs out,
/// and served first come, first served ([`WaitOrder::Fifo`]): a waiter joins the queue at its
/// first busy try, and while anyone queues, only the first in the queue is granted (a fresh
/// try, even on a free lock, finds it busy). A waiter that gives up leaves the queue.
/// Fence counters are kept per name after release (as every store keeps them) so fences never
/// go back. Clones share the store.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    slots: Arc<Mutex<HashMap<LockName, Slot>>>,
}

#[derive(Debug, Default)]
struct Slot {
    fence: u64,
    current: Option<Current>,
    released: Arc<Notify>,
    /// Tickets of the waiters, in arrival order.
    queue: VecDeque<u64>,
}

#[derive(Debug)]
struct Current {
    token: LeaseToken,
    fence: u64,
    expires: Instant,
}

enum Try {
    Granted(Grant),
    Busy(Instant),
}

impl MemoryBackend {
    /// What it declares (its [`LockBackend::capabilities`]).
    pub const DECLARED: Capabilities = Capabilities::new(
        Fencing::Strict,
        Expiry::Ttl,
        Wakeup::Push,
        WaitOrder::Fifo,
        Clock::Server,
    )
    .with_portable_lease(true)
    .with_failover(Failover::SingleServer);

    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<LockName, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends whatever lease `name` has and wakes waiters (the [`LockAdmin::force_release`] of
    /// this store, without its answer); whether there was a live lease. The holder learns of
    /// it at its next renewal (its `lost()` fires).
    pub fn evict(&self, name: &LockName) -> bool {
        self.evict_and_bump(name).is_some()
    }

    /// Ends `name`'s live lease, bumps its fence counter and wakes waiters: the lease ended,
    /// and the counter after the bump.
    fn evict_and_bump(&self, name: &LockName) -> Option<Forced> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        let current = slot.current.take();
        slot.released.notify_waiters();
        let current = current.filter(|c| c.expires > now)?;
        slot.fence += 1;
        Some(Forced::new(
            HeldLock::new(
                name.clone(),
                &current.token,
                Fence::new(current.fence),
                Some(current.expires - now),
                Some(slot.queue.len() as u64),
            ),
            Fence::new(slot.fence),
        ))
    }

    fn notifier(&self, name: &LockName) -> Arc<Notify> {
        self.slots()
            .entry(name.clone())
            .or_default()
            .released
            .clone()
    }

    /// One try by the waiter holding `ticket` (none on a first try): granted when the lock is
    /// free and nobody queues ahead.
    fn try_once(&self, name: &LockName, ttl: Duration, ticket: Option<u64>) -> Try {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(name.clone()).or_default();
        if let Some(current) = &slot.current
            && current.expires > now
        {
            return Try::Busy(current.expires);
        }
        if slot
            .queue
            .front()
            .is_some_and(|first| Some(*first) != ticket)
        {
            // Free, but another waiter is first in line: it is being woken.
            return Try::Busy(now + Duration::from_secs(3600));
        }
        if ticket.is_some() {
            slot.queue.pop_front();
        }
        slot.fence += 1;
        let token = LeaseToken::random();
        slot.current = Some(Current {
            token: token.clone(),
            fence: slot.fence,
            expires: now + ttl,
        });
        let lease = Lease::new(name.clone(), token, Fence::new(slot.fence), ttl)
            .with_expires_at(SystemTime::now() + ttl);
        Try::Granted(Grant::new(lease, now))
    }
}

/// A waiter's place in a lock's queue: leaves it when dropped, whichever way the acquisition
/// ended (served places were already taken off by the grant).
struct Place<'a> {
    backend: &'a MemoryBackend,
    name: LockName,
    ticket: u64,
    served: bool,
}

impl<'a> Place<'a> {
    fn join(backend: &'a MemoryBackend, name: &LockName) -> Self {
        let ticket = rand::random();
        backend
            .slots()
            .entry(name.clone())
            .or_default()
            .queue
            .push_back(ticket);
        Self {
            backend,
            name: name.clone(),
            ticket,
            served: false,
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.served {
            return;
        }
        let mut slots = self.backend.slots();
        if let Some(slot) = slots.get_mut(&self.name) {
            let was_first = slot.queue.front() == Some(&self.ticket);
            slot.queue.retain(|ticket| *ticket != self.ticket);
            if was_first {
                // The next in line may be waiting for a lock that is free.
                slot.released.notify_waiters();
            }
        }
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Self::DECLARED
    }

    fn store(&self) -> &'static str {
        "memory"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let mut place: Option<Place<'_>> = None;
        loop {
            // Register for the release notification before looking, so a release between the
            // look and the wait cannot be missed.
            let notify = self.notifier(request.name());
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let ticket = place.as_ref().map(|place| place.ticket);
            let holder_expires = match self.try_once(request.name(), request.ttl(), ticket) {
                Try::Granted(grant) => {
                    if let Some(place) = place.as_mut() {
                        place.served = true;
                    }
                    return Ok(grant);
                }
                Try::Busy(expires) => expires,
            };
            let deadline = request.deadline();
            if Instant::now() >= deadline {
                return Err(request.timeout_error());
            }
            if place.is_none() {
                place = Some(Place::join(self, request.name()));
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(holder_expires.min(deadline).into()) => {}
            }
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        crate::backend::validate_ttl(ttl)?;
        let now = Instant::now();
        let mut slots = self.slots();
        let current = slots
            .get_mut(lease.name())
            .and_then(|slot| slot.current.as_mut())
            .filter(|c| &c.token == lease.token() && c.expires > now)
            .ok_or_else(|| LockError::not_held(lease.name()))?;
        current.expires = now + ttl;
        let renewed = lease
            .clone()
            .with_ttl(ttl)
            .with_expires_at(SystemTime::now() + ttl);
        Ok(Grant::new(renewed, now))
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots
            .get_mut(lease.name())
            .ok_or_else(|| LockError::not_held(lease.name()))?;
        match &slot.current {
            Some(c) if &c.token == lease.token() && c.expires > now => {
                slot.current = None;
                // Every waiter looks; the first in the queue is granted.
                slot.released.notify_waiters();
                Ok(())
            }
            _ => Err(LockError::not_held(lease.name())),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        let now = Instant::now();
        let slots = self.slots();
        Ok(slots
            .get(name)
            .and_then(|slot| slot.current.as_ref())
            .filter(|c| c.expires > now)
            .map(|c| {
                LockInfo::new(
                    name.clone(),
                    c.token.clone(),
                    Fence::new(c.fence),
                    Some(c.expires - now),
                )
            }))
    }
}

#[async_trait]
impl LockAdmin for MemoryBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        let now = Instant::now();
        let slots = self.slots();
        let mut held: Vec<HeldLock> = slots
            .iter()
            .filter(|(name, _)| name.as_str().starts_with(prefix))
            .filter_map(|(name, slot)| {
                let current = slot.current.as_ref().filter(|c| c.expires > now)?;
                Some(HeldLock::new(
                    name.clone(),
                    &current.token,
                    Fence::new(current.fence),
                    Some(current.expires - now),
                    Some(slot.queue.len() as u64),
                ))
            })
            .collect();
        held.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(held)
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        Ok(self.evict_and_bump(name))
    }
}
