//! [`OpCounts`]: how many requests of each kind a backend sent to ZooKeeper, and the atomic
//! counters behind it.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// How many ZooKeeper requests a backend sent, by kind, since it was created.
///
/// The recipe's cost is visible here: an uncontended acquisition is one `create` and one
/// `list` (sent together), a release one `delete`, a renewal one `exists` (a batch of renewals
/// one `sync` and a `multiRead` per 500 leases); a waiter adds a `watch` of its own node and
/// of each of the two contenders before it (each set once, until it fires) and one `list` each
/// time one of those two goes (none when the one just before was the first contender, as its
/// last listing saw it, and was deleted).
/// Pings, session management and the client library's `removeWatches` of a watch dropped
/// unfired are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OpCounts {
    /// `create` requests (contender nodes, container and root nodes).
    pub creates: u64,
    /// `getChildren` requests of lock paths.
    pub lists: u64,
    /// `getData` requests that set a watch (a waiter's, on its own node or a contender
    /// before it).
    pub watches: u64,
    /// `getData` requests without a watch (`inspect`).
    pub reads: u64,
    /// `exists` requests (renewals, recovery after a lost reply).
    pub exists: u64,
    /// `delete` requests.
    pub deletes: u64,
    /// `sync` requests (`inspect` reads the leader's latest state; a batch of renewals syncs
    /// once).
    pub syncs: u64,
    /// `multiRead` requests: a batch of renewals reads the nodes of up to 500 leases in one.
    pub multi_reads: u64,
}

impl OpCounts {
    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.creates
            + self.lists
            + self.watches
            + self.reads
            + self.exists
            + self.deletes
            + self.syncs
            + self.multi_reads
    }
}

/// Field by field: the requests of several backends together.
impl std::ops::Add for OpCounts {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            creates: self.creates + other.creates,
            lists: self.lists + other.lists,
            watches: self.watches + other.watches,
            reads: self.reads + other.reads,
            exists: self.exists + other.exists,
            deletes: self.deletes + other.deletes,
            syncs: self.syncs + other.syncs,
            multi_reads: self.multi_reads + other.multi_reads,
        }
    }
}

impl std::iter::Sum for OpCounts {
    fn sum<I: Iterator<Item = Self>>(counts: I) -> Self {
        counts.fold(Self::default(), |sum, c| sum + c)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) creates: AtomicU64,
    pub(crate) lists: AtomicU64,
    pub(crate) watches: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) exists: AtomicU64,
    pub(crate) deletes: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) multi_reads: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> OpCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OpCounts {
            creates: get(&self.creates),
            lists: get(&self.lists),
            watches: get(&self.watches),
            reads: get(&self.reads),
            exists: get(&self.exists),
            deletes: get(&self.deletes),
            syncs: get(&self.syncs),
            multi_reads: get(&self.multi_reads),
        }
    }
}

/// Counts one request.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_field_by_field() {
        let one = OpCounts {
            creates: 1,
            lists: 2,
            watches: 3,
            reads: 4,
            exists: 5,
            deletes: 6,
            syncs: 7,
            multi_reads: 8,
        };
        let three: OpCounts = [one, one, one].into_iter().sum();
        assert_eq!(
            three,
            OpCounts {
                creates: 3,
                lists: 6,
                watches: 9,
                reads: 12,
                exists: 15,
                deletes: 18,
                syncs: 21,
                multi_reads: 24,
            }
        );
        assert_eq!(one.total(), 36);
        assert_eq!(three.total(), 3 * one.total());
        assert_eq!(std::iter::empty().sum::<OpCounts>(), OpCounts::default());
    }
}
