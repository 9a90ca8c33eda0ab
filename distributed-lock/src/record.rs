//! [`migration_record`]: a migration's record named by a URL, as a fleet's configuration and
//! `lockctl migrate` name it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

use lock_core::{
    LockError,
    migrate::{MemoryRecord, MigrationRecord},
};

use crate::{Store, StoreConfig};

static MEMORY: OnceLock<Mutex<HashMap<String, MemoryRecord>>> = OnceLock::new();

/// The migration record at `url`: `redis://host:port[?prefix=...]` (one server; the key
/// `<prefix>:{migration}:record`), or `memory://name` (in this process, for tests).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use distributed_lock::migrate::{Authority, MigrationRecord};
///
/// let record = distributed_lock::migration_record("memory://doc-migration").await?;
/// assert_eq!(record.read().await?.authority, Authority::From);
/// # Ok::<(), distributed_lock::LockError>(())
/// # }).unwrap();
/// ```
///
/// # Errors
/// [`LockError::InvalidOptions`] for a URL of another store (records are kept on one Redis
/// server for now) or of a cluster; a server that does not answer.
pub async fn migration_record(url: &str) -> Result<Arc<dyn MigrationRecord>, LockError> {
    let config: StoreConfig = url.parse()?;
    match &config.store {
        Store::Memory { instance } => {
            let record = MEMORY
                .get_or_init(Mutex::default)
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(instance.clone())
                .or_insert_with(|| MemoryRecord::new(0))
                .clone();
            Ok(Arc::new(record))
        }
        #[cfg(feature = "redis")]
        Store::Redis(redis) => {
            let backend = lock_redis::RedisBackend::connect(redis.clone()).await?;
            Ok(Arc::new(backend.migration_record()?))
        }
        #[allow(unreachable_patterns)] // With every store's feature, only MySQL and ZooKeeper.
        other => Err(LockError::invalid_options(format!(
            "a migration record is kept on one Redis server (redis://) or in process \
             (memory://), not on {}",
            other.label()
        ))),
    }
}
