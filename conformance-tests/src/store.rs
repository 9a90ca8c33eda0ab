//! [`TestStore`]: what a backend's test provides so the suite can run against it, including
//! the fault tools (taking a lock away behind its holder's back, planting foreign values).

use std::time::Duration;

use async_trait::async_trait;
use lock_core::{LockClient, LockError, LockName, MemoryBackend};

/// A backend under test, with the raw access to its store that fault scenarios need.
#[async_trait]
pub trait TestStore: Send + Sync + 'static {
    /// A new client, as a separate process would have it (its own connections or session).
    async fn client(&self) -> Result<LockClient, LockError>;

    /// Removes the lock from the store behind its holder's back, as an administrator would
    /// (delete the key, row or node).
    async fn revoke(&self, name: &LockName) -> Result<(), LockError>;

    /// What the store still has for `name` besides the fence counter (keys, rows, nodes),
    /// described for a failure message. Empty when nothing remains.
    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError>;

    /// Writes, under `name`'s place in the store, a value this library did not write.
    /// Only called when [`TestStore::can_plant_foreign`] is true; [`TestStore::revoke`]
    /// removes it.
    async fn plant_foreign(&self, name: &LockName) -> Result<(), LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            what: "planting foreign values".into(),
        })
    }

    /// Whether [`TestStore::plant_foreign`] is possible (a typed in-process store cannot hold
    /// a foreign value).
    fn can_plant_foreign(&self) -> bool {
        false
    }

    /// Whether another OS process can reach the same store (for the killed-holder scenario).
    fn cross_process(&self) -> bool {
        true
    }

    /// The short TTL scenarios use (session stores: the session timeout).
    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    /// The tolerance added to time bounds (scheduling, round trips, server timers).
    fn margin(&self) -> Duration {
        (self.ttl() / 2).max(Duration::from_millis(250))
    }
}

/// The [`TestStore`] of the in-memory reference backend.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    backend: MemoryBackend,
}

impl MemoryStore {
    /// A store over a fresh [`MemoryBackend`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The backend shared by every client of this store.
    pub fn backend(&self) -> &MemoryBackend {
        &self.backend
    }
}

#[async_trait]
impl TestStore for MemoryStore {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.backend.clone()))
    }

    async fn revoke(&self, name: &LockName) -> Result<(), LockError> {
        self.backend.force_release(name);
        Ok(())
    }

    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError> {
        let client = self.client().await?;
        Ok(client
            .inspect(name)
            .await?
            .map(|info| vec![format!("a live lease with fence {}", info.fence)])
            .unwrap_or_default())
    }

    fn cross_process(&self) -> bool {
        false
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(300)
    }
}
