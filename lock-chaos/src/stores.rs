//! The stores a campaign runs against, connected from the variables `cargo xtask services env`
//! prints, and the servers a store fault takes down.

use std::time::Duration;

use lock_core::{Backoff, Fencing, LockClient, LockError};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy, TableName};
use lock_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use lock_zookeeper::{ZkBackend, ZkConfig};

/// Every store a campaign knows, by the name the command line uses.
pub const STORES: [&str; 7] = [
    "redis",
    "redis-cluster",
    "redlock",
    "mysql-lease",
    "mysql-rowlock",
    "zookeeper",
    "zk-ensemble",
];

/// The ZooKeeper session timeout of campaign clients (the TTL of a session store: a worker
/// that died keeps its place, held or waiting, until its session expires).
pub const ZK_SESSION: Duration = Duration::from_secs(4);

/// The key prefix, table and ZooKeeper root of campaign locks.
const PREFIX: &str = "chaos";

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!(
            "{name} is not set: run `cargo xtask services up` and export `cargo xtask services env`"
        )
    })
}

fn list(name: &str) -> Result<Vec<String>, String> {
    Ok(var(name)?.split(',').map(str::to_owned).collect())
}

fn text(error: LockError) -> String {
    error.to_string()
}

/// A client of `store`: one of [`STORES`], or a store URL (`distributed_lock::connect`'s,
/// `migrate://` among them).
///
/// # Errors
/// An unknown store, a missing variable, or the store not answering.
pub async fn connect(store: &str) -> Result<LockClient, String> {
    if store.contains("://") {
        return distributed_lock::connect(store).await.map_err(text);
    }
    Ok(match store {
        "redis" => LockClient::new(
            RedisBackend::connect(
                RedisConfig::single(var("LOCK_TEST_REDIS_URL")?).key_prefix(PREFIX),
            )
            .await
            .map_err(text)?,
        ),
        "redis-cluster" => LockClient::new(
            RedisBackend::connect(
                RedisConfig::cluster(list("LOCK_TEST_REDIS_CLUSTER_URLS")?).key_prefix(PREFIX),
            )
            .await
            .map_err(text)?,
        ),
        "redlock" => LockClient::new(
            RedlockBackend::connect(
                RedlockConfig::new(list("LOCK_TEST_REDLOCK_URLS")?).key_prefix(PREFIX),
            )
            .await
            .map_err(text)?,
        ),
        "mysql-lease" | "mysql-rowlock" => {
            let strategy = if store == "mysql-lease" {
                Strategy::Lease
            } else {
                Strategy::RowLock
            };
            let table = TableName::new(mysql_table(store)).map_err(text)?;
            let config = MySqlConfig::new(var("LOCK_TEST_MYSQL_URL")?)
                .strategy(strategy)
                .table(table)
                .pool_size(2)
                .connect_timeout(Duration::from_secs(3));
            LockClient::new(MySqlBackend::connect(&config).await.map_err(text)?)
        }
        "zookeeper" | "zk-ensemble" => {
            let hosts = if store == "zookeeper" {
                var("LOCK_TEST_ZK_ADDR")?
            } else {
                var("LOCK_TEST_ZK_ENSEMBLE")?
            };
            LockClient::new(
                ZkBackend::connect(
                    ZkConfig::new(hosts)
                        .root(format!("/{PREFIX}"))
                        .session_timeout(ZK_SESSION),
                )
                .await
                .map_err(text)?,
            )
        }
        other => {
            return Err(format!(
                "unknown store `{other}`; known: {}",
                STORES.join(", ")
            ));
        }
    })
}

/// How long `store` can keep the lock from everyone because of clients that died or froze
/// (`pause`: the longest a campaign freezes a worker), where that is longer than the lease's
/// TTL: on ZooKeeper a dead or frozen waiter keeps its place until its session expires (the
/// session timeout plus a second for the server's tick), and the campaign's faults can put
/// two such waiters in a row (measured: 6.9 s free with a 4 s session); on the row lock,
/// InnoDB hands the row to a frozen waiter, which holds it until it wakes; on the MySQL lease,
/// a release hands the lease to the first waiter for its turn (the back-off maximum, at least
/// 1 s, plus 100 ms: 1.1 s with the campaign's default back-off), and a dead, frozen or
/// departed waiter keeps it that long (lock-mysql's README, "Bounded stalls"; measured: a gap
/// of 1.115 s after the release that handed it to a frozen worker), again two in a row. The
/// stalls of waiters in a row add up; a dead holder's own TTL comes before them but is not
/// counted as free time (its section lasts until its lease expires).
pub fn place_kept(store: &str, pause: Duration) -> Duration {
    match store {
        "zookeeper" | "zk-ensemble" => (ZK_SESSION + Duration::from_secs(1)) * 2,
        "mysql-rowlock" => pause,
        "mysql-lease" => lock_mysql::lease_waiter_turn(&Backoff::default()) * 2,
        _ => Duration::ZERO,
    }
}

/// How long `store`'s campaign client waits for one answer before it counts the request as
/// failed (a link slower than that makes the store unavailable, not stuck).
///
/// Redlock's client waits longer than its per-server time-out while a majority of its
/// servers answers late, up to `longest_wait` (four times it), aiming at twice the round trip a
/// majority took: that margin holds for round trips of up to half its longest wait, the bound
/// taken here. Round trips up to its longest wait may still be served: counted as an outage
/// here, which excuses their gaps (lenient, never a false failure).
pub fn request_timeout(store: &str) -> Duration {
    match store {
        "redlock" => RedlockConfig::default().longest_wait() / 2,
        "redis" | "redis-cluster" => RedisConfig::default().response_timeout,
        "mysql-lease" | "mysql-rowlock" => MySqlConfig::default().statement_timeout,
        // The ZooKeeper client's requests wait as long as the session lives.
        _ => ZK_SESSION,
    }
}

/// The table of a MySQL store's campaign locks (`chaos_mysql_lease`, `chaos_mysql_rowlock`).
pub fn mysql_table(store: &str) -> String {
    format!("chaos_{}", store.replace('-', "_"))
}

/// Whether `client`'s store declares strict fencing (then stale writes and fence regressions
/// fail a run).
pub fn strict(client: &LockClient) -> bool {
    client.capabilities().fencing == Fencing::Strict
}
