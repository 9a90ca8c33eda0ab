#![doc = include_str!("../README.md")]

mod memory;
mod migrate_url;
mod record;
mod requirement;
mod scheme;
mod store_config;
mod stores;

use std::sync::Arc;

/// Layers any backend can be wrapped in: `Counting`, and `Metrics` (feature `metrics`).
pub use lock_core::layer;
/// Moving locks between stores without a window of double grants (`MigratingBackend`).
pub use lock_core::migrate;
pub use lock_core::{
    Capabilities, Fence, Forced, HeldLock, Holder, Lease, LockAdmin, LockBackend, LockClient,
    LockError, LockGuard, LockInfo, LockName, LockOptions, LossReason,
};
pub use migrate_url::{MigrateConfig, PhaseName};
pub use record::migration_record;
pub use requirement::{REQUIREMENTS, Requirement};
pub use scheme::{Scheme, schemes};
pub use store_config::{AdminBackend, Store, StoreConfig};
pub use stores::declared;

/// Connects to the store `url` names and makes a client of it: the one line a service needs.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let locks = distributed_lock::connect("memory://doc").await?;
/// let guard = locks.lock("jobs/nightly").await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok::<(), distributed_lock::LockError>(())
/// # }).unwrap();
/// ```
///
/// # Errors
/// [`LockError::InvalidOptions`] for a URL that does not parse (naming what is wrong, never
/// the password) or a store weaker than its `require=`; whatever the store's `connect`
/// answers otherwise.
pub async fn connect(url: &str) -> Result<LockClient, LockError> {
    url.parse::<StoreConfig>()?.connect().await
}

/// Connects to the store `url` names: the backend, to wrap in layers or share, with the
/// operator's view of it ([`LockAdmin`]: list held locks, release one by force).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use distributed_lock::{LockAdmin, LockClient};
///
/// let store = distributed_lock::backend("memory://admin-doc").await?;
/// let locks = LockClient::new(store.clone());
/// let guard = locks.lock("jobs/a").await?;
/// let held = store.list("jobs/").await?;
/// assert_eq!(held[0].fence, guard.fence());
/// let forced = store.force_release(&held[0].name).await?.expect("it was held");
/// assert!(forced.fence_floor > guard.fence());
/// # Ok::<(), distributed_lock::LockError>(())
/// # }).unwrap();
/// ```
///
/// # Errors
/// As [`connect`].
pub async fn backend(url: &str) -> Result<Arc<dyn AdminBackend>, LockError> {
    url.parse::<StoreConfig>()?.backend().await
}

/// The workspace README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct WorkspaceReadmeDoctests;
