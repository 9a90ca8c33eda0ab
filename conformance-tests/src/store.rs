//! [`TestStore`]: what a backend's test provides so the suite can run against it, including
//! the fault tools (taking a lock away behind its holder's back, planting foreign values,
//! taking the store away for a moment).

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use lock_core::{LockAdmin, LockClient, LockError, LockName};

/// A backend under test, with the raw access to its store that fault scenarios need.
#[async_trait]
pub trait TestStore: Send + Sync + 'static {
    /// A new client, as a separate process would have it (its own connections or session).
    async fn client(&self) -> Result<LockClient, LockError>;

    /// Removes the lock from the store behind its holder's back, as an administrator would
    /// (delete the key, row or node).
    async fn revoke(&self, name: &LockName) -> Result<(), LockError>;

    /// The URL the store was declared with, password hidden (a store URL as
    /// `distributed_lock::connect` reads it: `redis://...?prefix=...`); shown by `cargo xtask
    /// compare` beside the results. Empty for a store without one.
    fn url(&self) -> String {
        String::new()
    }

    /// The store's [`LockAdmin`], connected as an operator's tool would be (its own
    /// connections). Every backend of this workspace has one; the default is for a store
    /// that does not, whose `admin/` scenario then fails.
    async fn admin(&self) -> Result<Arc<dyn LockAdmin>, LockError> {
        Err(LockError::unsupported("LockAdmin"))
    }

    /// What the store still has for `name` besides the fence counter (keys, rows, nodes),
    /// described for a failure message. Empty when nothing remains.
    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError>;

    /// Writes, under `name`'s place in the store, a value this library did not write.
    /// Only called when [`TestStore::can_plant_foreign`] is true; [`TestStore::revoke`]
    /// removes it.
    async fn plant_foreign(&self, name: &LockName) -> Result<(), LockError> {
        let _ = name;
        Err(LockError::unsupported("planting foreign values"))
    }

    /// Whether [`TestStore::plant_foreign`] is possible (a typed in-process store cannot hold
    /// a foreign value).
    fn can_plant_foreign(&self) -> bool {
        false
    }

    /// Makes the store unreachable for every client (its servers stopped; for a quorum store, a
    /// majority of them) until [`TestStore::end_outage`]. Only called when
    /// [`TestStore::can_fail`] is true.
    async fn begin_outage(&self) -> Result<(), LockError> {
        Err(LockError::unsupported("outages"))
    }

    /// Brings the store back from [`TestStore::begin_outage`] and waits until it serves.
    async fn end_outage(&self) -> Result<(), LockError> {
        Err(LockError::unsupported("outages"))
    }

    /// Whether [`TestStore::begin_outage`] is possible, and why not.
    fn can_fail(&self) -> Result<(), &'static str> {
        Err("this store cannot be taken away in a test")
    }

    /// Whether another OS process can reach the same store (for the killed-holder scenario).
    fn cross_process(&self) -> bool {
        true
    }

    /// The short TTL scenarios use (session stores: the TTL of their leases).
    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    /// How long the store keeps the hold of a holder process that died: the TTL, or on a
    /// session store the session timeout, which may be longer than its leases' TTL.
    fn abandoned_hold_lasts(&self) -> Duration {
        self.ttl()
    }

    /// The tolerance added to time bounds (scheduling, round trips, server timers).
    fn margin(&self) -> Duration {
        (self.ttl() / 2).max(Duration::from_millis(250))
    }
}
