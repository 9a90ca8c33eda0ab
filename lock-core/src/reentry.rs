//! The client's reentry table: which hold each (holder, name) has through this client, so a
//! holder's next acquisition of a name it holds joins that hold instead of asking the store.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError, Weak},
};

use crate::{HolderId, LockName, hold::Hold};

/// One (holder, name): serialises the holder's own acquisitions of that name and remembers its
/// live hold so the next acquisition re-enters instead of asking the store.
pub(crate) type Slot = tokio::sync::Mutex<Weak<Hold>>;
type SlotKey = (HolderId, LockName);

/// The slots of one client, kept only while a holder holds or waits for a name.
#[derive(Default)]
pub(crate) struct Reentry {
    slots: Mutex<HashMap<SlotKey, Arc<Slot>>>,
}

impl Reentry {
    fn slots(&self) -> MutexGuard<'_, HashMap<SlotKey, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot of (`holder`, `name`), held for the length of one acquisition.
    pub(crate) fn enter(self: &Arc<Self>, holder: HolderId, name: &LockName) -> SlotUse {
        let slot = self
            .slots()
            .entry((holder, name.clone()))
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Weak::new())))
            .clone();
        SlotUse {
            table: self.clone(),
            key: (holder, name.clone()),
            slot,
        }
    }

    /// Forgets the (holder, name) slot when it is idle: nobody but the caller (who holds `own`
    /// references to it) is using or waiting on it, and it remembers no hold with live guards
    /// (that hold must stay reachable for reentry).
    pub(crate) fn forget(&self, holder: HolderId, name: &LockName, own: usize) {
        let key = (holder, name.clone());
        let mut slots = self.slots();
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

    /// How many slots `holder` has in this table.
    #[cfg(test)]
    pub(crate) fn count(&self, holder: HolderId) -> usize {
        self.slots().keys().filter(|(h, _)| *h == holder).count()
    }
}

/// A holder's use of one slot during an acquisition: forgets the slot when the acquisition
/// ends, whichever way (granted, refused, failed, or cancelled by dropping the future).
pub(crate) struct SlotUse {
    table: Arc<Reentry>,
    key: SlotKey,
    slot: Arc<Slot>,
}

impl SlotUse {
    pub(crate) fn slot(&self) -> &Slot {
        &self.slot
    }
}

impl Drop for SlotUse {
    fn drop(&mut self) {
        self.table.forget(self.key.0, &self.key.1, 1);
    }
}
