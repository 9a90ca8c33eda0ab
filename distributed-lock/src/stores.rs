//! What each store declares with its default settings: the table [`Requirement`] errors
//! name stores from, read from each backend's own declaration (`RedisBackend::declared`,
//! `RedlockBackend::DECLARED`, `MySqlBackend::declared`, `ZkBackend::declared`,
//! `MemoryBackend::DECLARED`), so it cannot drift from them. The live backends are checked
//! against it in this crate's tests.
//!
//! [`Requirement`]: crate::Requirement

use lock_core::{Capabilities, MemoryBackend};

/// `(store, capabilities)` of every store this build has, with its default settings: MySQL on
/// a server that flushes every commit (`innodb_flush_log_at_trx_commit = 1`, the default),
/// ZooKeeper with one server or an ensemble of three, Redis without `replica_acks`.
pub fn declared() -> Vec<(&'static str, Capabilities)> {
    #[allow(unused_mut)] // Stores join with their features.
    let mut table = vec![("memory", MemoryBackend::DECLARED)];
    #[cfg(feature = "redis")]
    {
        use lock_redis::{RedisBackend, RedisConfig, RedlockBackend};
        table.push(("redis", RedisBackend::declared(&RedisConfig::default())));
        let cluster = RedisConfig::cluster(["redis://127.0.0.1:7000"]);
        table.push(("redis+cluster", RedisBackend::declared(&cluster)));
        table.push(("redlock", RedlockBackend::DECLARED));
    }
    #[cfg(feature = "mysql")]
    {
        use lock_core::Fencing;
        use lock_mysql::{MySqlBackend, Strategy};
        table.push((
            "mysql (lease)",
            MySqlBackend::declared(Strategy::Lease, Fencing::Strict),
        ));
        table.push((
            "mysql (row-lock)",
            MySqlBackend::declared(Strategy::RowLock, Fencing::Strict),
        ));
    }
    #[cfg(feature = "zookeeper")]
    {
        use lock_zookeeper::{ZkBackend, ZkConfig};
        let one = ZkConfig::new("127.0.0.1:2181");
        table.push(("zookeeper (one server)", ZkBackend::declared(&one)));
        let ensemble = ZkConfig::new("127.0.0.1:2181,127.0.0.2:2181,127.0.0.3:2181");
        table.push(("zookeeper (ensemble)", ZkBackend::declared(&ensemble)));
    }
    table
}
