//! [`MemoryBackend`]: the complete in-process reference implementation of the contract.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::{
    AcquireRequest, Capabilities, Clock, Expiry, Failover, Fence, Fencing, Grant, Lease,
    LeaseToken, LockBackend, LockError, LockInfo, LockName, WaitOrder, Wakeup,
};

/// An in-process lock store: every rule of the contract, no server.
///
/// It is the reference the conformance suite is checked against and the default in examples.
/// Waiters are woken by release notifications (no polling) or when the holder's TTL runs out.
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
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<LockName, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes whatever lease `name` has, as an administrator deleting the key would, and wakes
    /// waiters. Returns whether there was a live lease. The holder learns of it at its next
    /// renewal (its `lost()` fires).
    pub fn force_release(&self, name: &LockName) -> bool {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        let live = slot
            .current
            .take()
            .is_some_and(|c| c.expires > Instant::now());
        slot.released.notify_waiters();
        live
    }

    fn notifier(&self, name: &LockName) -> Arc<Notify> {
        self.slots()
            .entry(name.clone())
            .or_default()
            .released
            .clone()
    }

    fn try_once(&self, name: &LockName, ttl: Duration) -> Try {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(name.clone()).or_default();
        if let Some(current) = &slot.current
            && current.expires > now
        {
            return Try::Busy(current.expires);
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

#[async_trait]
impl LockBackend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            Fencing::Strict,
            Expiry::Ttl,
            Wakeup::Push,
            WaitOrder::None,
            Clock::Server,
        )
        .with_portable_lease(true)
        .with_failover(Failover::SingleServer)
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        loop {
            // Register for the release notification before looking, so a release between the
            // look and the wait cannot be missed.
            let notify = self.notifier(request.name());
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let holder_expires = match self.try_once(request.name(), request.ttl()) {
                Try::Granted(grant) => return Ok(grant),
                Try::Busy(expires) => expires,
            };
            let deadline = request.deadline();
            if Instant::now() >= deadline {
                return Err(request.timeout_error());
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(holder_expires.min(deadline).into()) => {}
            }
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        crate::validate_ttl(ttl)?;
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
