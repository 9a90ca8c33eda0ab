//! [`LockAdmin`]: what an operator can see and do to a store's locks (list them, take one
//! away), beside the contract services use. Every backend of this workspace implements it.
//!
//! **Observability, not a pre-check.** What [`LockAdmin::list`] shows was true when the store
//! answered and may be false by the time it is read: a service must never ask "is it
//! locked?" and then act on the answer; it acquires, and the store decides.

use std::{fmt, time::Duration};

use async_trait::async_trait;

use crate::{Fence, LockError, LockName, backend::LeaseToken};

/// One held lock as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The lock's name.
    pub name: LockName,
    /// A fingerprint of the holder's token ([`LeaseToken::fingerprint`]): enough to tell
    /// holders apart, useless for releasing or renewing their lease.
    pub holder: String,
    /// The holder's fence.
    pub fence: Fence,
    /// Time left before the lease ends by itself, for TTL stores.
    pub expires_in: Option<Duration>,
    /// Clients waiting for it, where the store keeps them (a queue it can count).
    pub waiters: Option<u64>,
}

impl HeldLock {
    /// A held lock.
    pub fn new(
        name: LockName,
        token: &LeaseToken,
        fence: Fence,
        expires_in: Option<Duration>,
        waiters: Option<u64>,
    ) -> Self {
        Self {
            name,
            holder: token.fingerprint(),
            fence,
            expires_in,
            waiters,
        }
    }
}

/// What a forced release did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Forced {
    /// The hold that was ended.
    pub evicted: HeldLock,
    /// Above the evicted holder's fence, and at or below the fence of every later holder. A
    /// resource told to reject fences below it rejects the evicted holder's late writes even
    /// before the next holder writes.
    pub fence_floor: Fence,
}

impl Forced {
    /// A forced release that ended `evicted` and left the fence counter at `fence_floor`.
    pub fn new(evicted: HeldLock, fence_floor: Fence) -> Self {
        Self {
            evicted,
            fence_floor,
        }
    }
}

/// An operator's view of a store: list held locks, end a hold by force.
#[async_trait]
pub trait LockAdmin: Send + Sync + fmt::Debug {
    /// The locks held now whose names start with `prefix` (`""`: every lock of this
    /// client's namespace: its key prefix, table or root), by name.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] on store failures.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError>;

    /// Ends whatever hold `name` has, as an operator taking a lock away (a holder stuck
    /// mid-section, a process gone without its session ending). The holder is not asked:
    /// it learns at its next renewal (or, on session stores, when its session or connection
    /// ends) and its `lost()` fires then; until then it may still believe it holds the lock.
    /// So the answer carries a fence floor ([`Forced::fence_floor`]): the evicted holder's
    /// writes are rejected by any resource that has seen a later fence or been told the
    /// floor. `None` when nothing was held.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] on store failures;
    /// [`LockError::Unsupported`] where the store cannot take a hold away (the message says
    /// what to do instead).
    async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError>;
}
