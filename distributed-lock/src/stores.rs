//! What each store declares with its default settings: the table [`Requirement`] errors
//! name stores from (the live backends are checked against it in this crate's tests).
//!
//! [`Requirement`]: crate::Requirement

use lock_core::{Capabilities, Clock, Expiry, Failover, Fencing, WaitOrder, Wakeup};

/// `(store, capabilities)` of every store with its default settings: MySQL on a server that
/// flushes every commit (`innodb_flush_log_at_trx_commit = 1`, the default), ZooKeeper with
/// one server or an ensemble of three, Redis without `replica_acks`.
pub const DECLARED: [(&str, Capabilities); 8] = [
    (
        "memory",
        Capabilities::new(
            Fencing::Strict,
            Expiry::Ttl,
            Wakeup::Push,
            WaitOrder::Fifo,
            Clock::Server,
        )
        .with_portable_lease(true),
    ),
    (
        "redis",
        Capabilities::new(
            Fencing::Strict,
            Expiry::Ttl,
            Wakeup::Push,
            WaitOrder::Fifo,
            Clock::Server,
        )
        .with_portable_lease(true),
    ),
    (
        "redis+cluster",
        Capabilities::new(
            Fencing::BestEffort,
            Expiry::Ttl,
            Wakeup::Push,
            WaitOrder::Fifo,
            Clock::Server,
        )
        .with_portable_lease(true)
        .with_failover(Failover::AsyncReplica),
    ),
    (
        "redlock",
        Capabilities::new(
            Fencing::BestEffort,
            Expiry::Ttl,
            Wakeup::Poll,
            WaitOrder::Fair,
            Clock::Client,
        )
        .with_portable_lease(true)
        .with_failover(Failover::Quorum),
    ),
    (
        "mysql (lease)",
        Capabilities::new(
            Fencing::Strict,
            Expiry::Ttl,
            Wakeup::Poll,
            WaitOrder::Fifo,
            Clock::Server,
        )
        .with_portable_lease(true),
    ),
    (
        "mysql (row-lock)",
        Capabilities::new(
            Fencing::Strict,
            Expiry::Session,
            Wakeup::Push,
            WaitOrder::Fair,
            Clock::Server,
        )
        .with_batched_renewals(false),
    ),
    (
        "zookeeper (one server)",
        Capabilities::new(
            Fencing::Strict,
            Expiry::Session,
            Wakeup::Push,
            WaitOrder::Fifo,
            Clock::None,
        ),
    ),
    (
        "zookeeper (ensemble)",
        Capabilities::new(
            Fencing::Strict,
            Expiry::Session,
            Wakeup::Push,
            WaitOrder::Fifo,
            Clock::None,
        )
        .with_failover(Failover::Quorum)
        .with_replica_acks(1),
    ),
];
