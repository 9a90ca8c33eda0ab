//! [`Holder`]: the unit of ownership and reentrancy.

use std::fmt;

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
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    id: HolderId,
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

impl Holder {
    /// A new holder with a fresh random id.
    pub fn new() -> Self {
        Self {
            id: HolderId(rand::random()),
        }
    }

    /// The holder's id.
    pub fn id(&self) -> HolderId {
        self.id
    }
}

impl Default for Holder {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holder").field("id", &self.id).finish()
    }
}
