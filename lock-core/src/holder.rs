//! [`Holder`]: the unit of ownership and reentrancy.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError, Weak},
};

use crate::{LockName, hold::Hold};

/// The identity that owns locks: a request, a job, a task chain — never "a thread".
///
/// Reentrancy is counted per holder (and per [`LockClient`](crate::LockClient)), once, for
/// every backend: `n` acquisitions of one name by one holder return `n` guards sharing one
/// store lease, and the lease is released when the last of them is. Different holders exclude
/// each other exactly like different processes. Clones share the identity.
///
/// ```
/// use lock_core::Holder;
///
/// let job = Holder::new();
/// assert_eq!(job.clone().id(), job.id());
/// assert_ne!(Holder::new().id(), job.id());
/// ```
#[derive(Clone)]
pub struct Holder {
    inner: Arc<HolderInner>,
}

struct HolderInner {
    id: HolderId,
    slots: Mutex<HashMap<SlotKey, Arc<Slot>>>,
}

/// The unique id of a [`Holder`] (128 random bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(u128);

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderId({self})")
    }
}

/// One (client, name) of a holder: serialises the holder's own acquisitions of that name and
/// remembers its live hold so the next acquisition re-enters instead of asking the store.
pub(crate) type Slot = tokio::sync::Mutex<Weak<Hold>>;
type SlotKey = (u64, LockName);

impl Holder {
    /// A new holder with a fresh random id.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(HolderInner {
                id: HolderId(rand::random()),
                slots: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The holder's id.
    pub fn id(&self) -> HolderId {
        self.inner.id
    }

    fn slot(&self, client: u64, name: &LockName) -> Arc<Slot> {
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        slots
            .entry((client, name.clone()))
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Weak::new())))
            .clone()
    }

    /// How many (client, name) slots the holder keeps.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Forgets the (client, name) slot when it is idle: nobody but the caller (who holds
    /// `own` references to it) is using or waiting on it, and it remembers no hold with live
    /// guards (that hold must stay reachable for reentry).
    pub(crate) fn forget_slot(&self, client: u64, name: &LockName, own: usize) {
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (client, name.clone());
        let idle = slots.get(&key).is_some_and(|slot| {
            Arc::strong_count(slot) == 1 + own
                && slot
                    .try_lock()
                    .is_ok_and(|hold| hold.upgrade().is_none_or(|hold| hold.depth() == 0))
        });
        if idle {
            slots.remove(&key);
        }
    }
}

/// A holder's use of one slot during an acquisition: forgets the slot when the acquisition
/// ends, whichever way (granted, refused, failed, or cancelled by dropping the future).
pub(crate) struct SlotUse {
    holder: Holder,
    client: u64,
    name: LockName,
    slot: Arc<Slot>,
}

impl SlotUse {
    pub(crate) fn new(holder: &Holder, client: u64, name: &LockName) -> Self {
        Self {
            holder: holder.clone(),
            client,
            name: name.clone(),
            slot: holder.slot(client, name),
        }
    }

    pub(crate) fn slot(&self) -> &Slot {
        &self.slot
    }
}

impl Drop for SlotUse {
    fn drop(&mut self) {
        self.holder.forget_slot(self.client, &self.name, 1);
    }
}

impl Default for Holder {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for Holder {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}

impl Eq for Holder {}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holder")
            .field("id", &self.inner.id)
            .finish()
    }
}
