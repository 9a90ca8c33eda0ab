//! [`Capabilities`]: what a backend promises, as plain data.

use serde::{Deserialize, Serialize};

/// What a backend guarantees and how it behaves: plain data a team can compare stores by, and
/// that the conformance suite reads to choose the scenarios that apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whether fences are strictly monotonic per name.
    pub fencing: Fencing,
    /// How a hold that is not renewed ends.
    pub expiry: Expiry,
    /// How waiters learn that the lock was released.
    pub wakeup: Wakeup,
    /// Whether waiters are served in arrival order.
    pub order: WaitOrder,
    /// Whose clock decides expiry.
    pub clock: Clock,
    /// Whether a serialized [`Lease`](crate::Lease) can be renewed or released from another
    /// process or client.
    pub portable_lease: bool,
    /// What happens to held locks when a store node fails.
    pub failover: Failover,
    /// Replicas that must acknowledge an acquisition before it is granted (0 = none).
    pub replica_acks: u32,
    /// Whether renewing many holds costs about one round trip (a pipeline, a script, one
    /// statement), or one per hold (each hold lives on its own connection).
    #[serde(default = "yes")]
    pub batched_renewals: bool,
}

fn yes() -> bool {
    true
}

impl Capabilities {
    /// Capabilities from the five defining properties; `portable_lease` starts false,
    /// `failover` as [`Failover::SingleServer`], `replica_acks` as 0, `batched_renewals` true.
    pub const fn new(
        fencing: Fencing,
        expiry: Expiry,
        wakeup: Wakeup,
        order: WaitOrder,
        clock: Clock,
    ) -> Self {
        Self {
            fencing,
            expiry,
            wakeup,
            order,
            clock,
            portable_lease: false,
            failover: Failover::SingleServer,
            replica_acks: 0,
            batched_renewals: true,
        }
    }

    /// Sets [`Capabilities::portable_lease`].
    pub const fn with_portable_lease(mut self, portable: bool) -> Self {
        self.portable_lease = portable;
        self
    }

    /// Sets [`Capabilities::failover`].
    pub const fn with_failover(mut self, failover: Failover) -> Self {
        self.failover = failover;
        self
    }

    /// Sets [`Capabilities::batched_renewals`].
    pub const fn with_batched_renewals(mut self, batched: bool) -> Self {
        self.batched_renewals = batched;
        self
    }

    /// Sets [`Capabilities::replica_acks`].
    pub const fn with_replica_acks(mut self, replicas: u32) -> Self {
        self.replica_acks = replicas;
        self
    }
}

/// The fencing guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Fencing {
    /// Every fence is strictly greater than every earlier fence for the name.
    Strict,
    /// Fences increase in normal operation but a failure (a restarted node without
    /// persistence, a quorum that changed) can repeat or lower one.
    BestEffort,
}

/// How a hold that is not renewed ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Expiry {
    /// The lease has a TTL in the store and ends by itself unless renewed.
    Ttl,
    /// The hold lives as long as the client's session or connection.
    Session,
}

/// How a waiter learns that the lock is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Wakeup {
    /// The store notifies waiters on release (pub/sub, watch, lock queue).
    Push,
    /// Waiters retry with jittered back-off.
    Poll,
}

/// The order in which waiters get the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum WaitOrder {
    /// First come, first served.
    Fifo,
    /// No waiter is passed over indefinitely: a client that releases and takes the lock again
    /// goes behind the clients already waiting, but the order among waiters is not exactly
    /// the order they came in (for example it follows the waiters' own clocks, or the store's
    /// lock scheduler).
    Fair,
    /// Any waiter may win: a waiter can be passed over for as long as others keep taking the
    /// lock.
    None,
}

/// Whose clock decides when a lease expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Clock {
    /// The store's own clock: client clock skew cannot cause a double grant.
    Server,
    /// Client clocks take part (Redlock's validity arithmetic).
    Client,
    /// No clock: the hold ends with a session, not a time.
    None,
}

/// What happens to held locks when a store node fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Failover {
    /// One server (or one process): while it is down nothing can be acquired; a restart
    /// without persistence forgets held locks.
    SingleServer,
    /// A replicated primary that fails over to an asynchronously replicated copy may forget a
    /// lock it granted just before failing.
    AsyncReplica,
    /// A majority of nodes decides: a minority of nodes may fail without losing or
    /// double-granting a lock.
    Quorum,
}
