//! The stores a migration between every ordered pair runs over (`tests/migration.rs` proves
//! the pairs, `benches/migration.rs` measures them), connected from the `LOCK_TEST_*`
//! variables.

use std::sync::Arc;

use conformance_tests::faults::env_var;
use distributed_lock::{LockBackend, StoreConfig};

use crate::support::hosts;

/// Every store a migration runs between.
pub(crate) const STORES: [&str; 6] = [
    "memory",
    "redis",
    "redlock",
    "mysql-lease",
    "mysql-rowlock",
    "zookeeper",
];

/// Every ordered pair of [`STORES`]: two in-process instances make a pair of their own; a
/// server with itself does not.
pub(crate) fn pairs() -> Vec<(&'static str, &'static str)> {
    STORES
        .iter()
        .flat_map(|from| STORES.iter().map(move |to| (*from, *to)))
        .filter(|(from, to)| from != to || *from == "memory")
        .collect()
}

/// The URL of `store` for this run (`side` keeps the two sides of a memory pair apart).
pub(crate) fn url(store: &str, side: &str) -> Result<String, String> {
    let var = |name: &str| env_var(name).map_err(|e| e.0);
    Ok(match store {
        "memory" => format!("memory://migration-{side}"),
        "redis" => format!("{}?prefix=migration", var("LOCK_TEST_REDIS_URL")?),
        "redlock" => format!(
            "redlock://{}?prefix=migration&node_timeout_ms=200",
            hosts(&var("LOCK_TEST_REDLOCK_URLS")?)
        ),
        "mysql-lease" => format!("{}?table=migration_leases", var("LOCK_TEST_MYSQL_URL")?),
        "mysql-rowlock" => format!(
            "{}?strategy=row-lock&table=migration_row_locks",
            var("LOCK_TEST_MYSQL_URL")?
        ),
        "zookeeper" => format!("zk://{}/migration", var("LOCK_TEST_ZK_ADDR")?),
        other => return Err(format!("no store `{other}`")),
    })
}

/// A backend of `store` on `side`, with connections of its own.
pub(crate) async fn store_backend(store: &str, side: &str) -> Result<Arc<dyn LockBackend>, String> {
    let config: StoreConfig = url(store, side)?
        .parse()
        .map_err(|e: distributed_lock::LockError| e.to_string())?;
    let backend: Arc<dyn LockBackend> = config.backend().await.map_err(|e| e.to_string())?;
    Ok(backend)
}
