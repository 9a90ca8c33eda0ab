//! `migrate://`: a client in one phase of a migration between two stores, named by a URL, so
//! a fleet moves through the phases by configuration (see the README's "Moving locks to
//! another store").

use std::{fmt, sync::Arc};

use async_trait::async_trait;
use lock_core::{
    Capabilities, Forced, HeldLock, Lease, LockAdmin, LockBackend, LockError, LockInfo, LockName,
    backend::{AcquireRequest, Grant, StoreUrl, redact_url},
    migrate::{MigratingBackend, Phase},
};
use serde::{Deserialize, Serialize};

use crate::{Store, migration_record};

/// A client of a migration from one store to another, in one [`Phase`]:
/// `migrate://?from=URL&to=URL&record=URL&phase=old|dual|new`, each URL percent-encoded
/// (`?` as `%3F`, `&` as `%26`, `=` as `%3D`).
///
/// ```
/// use distributed_lock::{Store, StoreConfig};
///
/// let url = "migrate://?from=redis://10.0.0.1:6379%3Fprefix%3Dapp\
///            &to=zk://10.0.0.2:2181/app&record=redis://10.0.0.1:6379&phase=dual";
/// let config: StoreConfig = url.parse()?;
/// let Store::Migrate(migration) = &config.store else { unreachable!() };
/// assert_eq!(migration.from.label(), "redis");
/// assert_eq!(migration.to.label(), "zookeeper (one server)");
/// assert!("migrate://?from=memory://a&to=memory://b&record=memory://r&phase=both"
///     .parse::<StoreConfig>()
///     .is_err());
/// # Ok::<(), distributed_lock::LockError>(())
/// ```
///
/// Such a client locks as [`MigratingBackend`] does in its phase; it refuses to start in a
/// phase the record forbids (`new` before the flip, `old` after it). Listing and forcing locks
/// ([`LockAdmin`]) take the URL of one store: a migration's locks live in two.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MigrateConfig {
    /// The store locks move from.
    pub from: Box<Store>,
    /// The store locks move to.
    pub to: Box<Store>,
    /// The migration record's URL (see [`migration_record`]).
    pub record: String,
    /// Which stores this client locks in.
    pub phase: PhaseName,
}

/// A [`Phase`] as configuration spells it: `old`, `dual` or `new`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PhaseName {
    /// [`Phase::Old`].
    Old,
    /// [`Phase::Dual`].
    Dual,
    /// [`Phase::New`].
    New,
}

impl PhaseName {
    fn phase(self) -> Phase {
        match self {
            Self::Old => Phase::Old,
            Self::Dual => Phase::Dual,
            Self::New => Phase::New,
        }
    }
}

impl fmt::Display for PhaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Old => "old",
            Self::Dual => "dual",
            Self::New => "new",
        })
    }
}

fn invalid(reason: String) -> LockError {
    LockError::invalid_options(reason)
}

impl MigrateConfig {
    /// Parses the `migrate://` URL (see the type's docs).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming what is wrong: a host or path (the URL has only a
    /// query), a missing or unknown setting, a phase other than `old`, `dual`, `new`, a store
    /// URL that does not parse, or a `migrate://` inside one.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        // The outer parser's errors quote keys and hosts; here those may be pieces of a
        // password in a nested URL whose `&` or `@` was not encoded: they are not repeated.
        let hidden = |_| {
            invalid(
                "`migrate://` is `migrate://?from=URL&to=URL&record=URL&phase=old|dual|new`, \
                 each URL percent-encoded (`?` `%3F`, `&` `%26`, `=` `%3D`, `@` `%40`, `+` `%2B`, \
                 `%` `%25`); this one is not (its text is not repeated: it may hold a password)"
                    .into(),
            )
        };
        let mut parsed = StoreUrl::parse(url).map_err(hidden)?;
        if !parsed.hosts().is_empty() || !parsed.path().is_empty() {
            return Err(invalid(
                "`migrate://` takes no host or path: `migrate://?from=URL&to=URL&record=URL&phase=dual`"
                    .into(),
            ));
        }
        let mut need = |key: &str| {
            parsed.take(key)?.ok_or_else(|| {
                invalid(format!(
                    "`migrate://` needs `{key}` (from, to, record and phase, each URL \
                     percent-encoded)"
                ))
            })
        };
        let (from, to, record, phase) =
            (need("from")?, need("to")?, need("record")?, need("phase")?);
        parsed.finish().map_err(hidden)?;
        let store = |key: &str, url: &str| -> Result<Box<Store>, LockError> {
            Store::from_url(url)
                .map(Box::new)
                .map_err(|e| invalid(format!("`migrate://`'s `{key}`: {e}")))
        };
        let phase = match phase.as_str() {
            "old" => PhaseName::Old,
            "dual" => PhaseName::Dual,
            "new" => PhaseName::New,
            _ => {
                return Err(invalid(
                    "`migrate://`'s phase is `old`, `dual` or `new`".into(),
                ));
            }
        };
        let config = Self {
            from: store("from", &from)?,
            to: store("to", &to)?,
            record,
            phase,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks what a URL or a configuration file gave: two stores that are not migrations and
    /// not the same store, and a record URL that parses.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] saying which.
    pub fn validate(&self) -> Result<(), LockError> {
        for (key, store) in [("from", &self.from), ("to", &self.to)] {
            if matches!(**store, Store::Migrate(_)) {
                return Err(invalid(format!(
                    "`migrate://`'s `{key}` is itself a migration; name a store"
                )));
            }
        }
        if self.from == self.to {
            return Err(invalid(
                "`migrate://`'s `from` and `to` are the same store: a dual client would wait \
                 for itself"
                    .into(),
            ));
        }
        Store::from_url(&self.record)
            .map_err(|e| invalid(format!("`migrate://`'s `record`: {e}")))?;
        Ok(())
    }

    /// Connects both stores and the record, and makes the phase's backend.
    pub(crate) async fn backend(&self) -> Result<Migrating, LockError> {
        self.validate()?;
        let from: Arc<dyn LockBackend> = Box::pin(self.from.backend()).await?;
        let to: Arc<dyn LockBackend> = Box::pin(self.to.backend()).await?;
        let record = migration_record(&self.record).await?;
        Ok(Migrating(
            MigratingBackend::new(from, to, record, self.phase.phase()).await?,
        ))
    }
}

impl fmt::Debug for MigrateConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrateConfig")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("record", &redact_url(&self.record))
            .field("phase", &self.phase)
            .finish()
    }
}

impl fmt::Display for MigrateConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "migration from {} to {} ({})",
            self.from, self.to, self.phase
        )
    }
}

/// A [`MigratingBackend`] with the operator's view refused: a migration's locks live in two
/// stores, each listed and forced with its own URL.
#[derive(Debug)]
pub(crate) struct Migrating(MigratingBackend);

fn two_stores() -> LockError {
    invalid(
        "a `migrate://` URL names two stores: list or force-release locks with the URL of \
         each (`--url FROM`, `--url TO`)"
            .into(),
    )
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LockBackend for Migrating {
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn store(&self) -> &'static str {
        self.0.store()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.0.acquire(request).await
    }
    async fn renew(&self, lease: &Lease, ttl: std::time::Duration) -> Result<Grant, LockError> {
        self.0.renew(lease, ttl).await
    }
    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        self.0.renew_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.0.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.0.inspect(name).await
    }
}

#[async_trait]
impl LockAdmin for Migrating {
    async fn list(&self, _prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        Err(two_stores())
    }
    async fn force_release(&self, _name: &LockName) -> Result<Option<Forced>, LockError> {
        Err(two_stores())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nested URL whose password holds a raw `&` splits into keys the outer parser would
    /// quote: nothing of it is repeated.
    #[test]
    fn an_unencoded_nested_password_is_not_repeated() {
        for url in [
            "migrate://?from=redis://:pass&s3cr3t%40h:1&to=zk://h:2&record=memory://r&phase=dual",
            "migrate://?from=redis://:pass&from=s3cr3t&to=zk://h:2&record=memory://r&phase=dual",
        ] {
            let error = MigrateConfig::from_url(url).unwrap_err().to_string();
            assert!(!error.contains("s3cr3t"), "{url}: {error}");
            assert!(error.contains("percent-encoded"), "{url}: {error}");
        }
    }

    #[test]
    fn the_same_store_twice_or_a_nested_migration_is_refused() {
        let same = "migrate://?from=memory://a&to=memory://a&record=memory://r&phase=dual";
        let error = MigrateConfig::from_url(same).unwrap_err().to_string();
        assert!(error.contains("same store"), "{error}");
        let nested = "migrate://?from=migrate://%3Ffrom%3Dmemory://x%26to%3Dmemory://y%26record%3Dmemory://r%26phase%3Ddual&to=memory://b&record=memory://r&phase=dual";
        let error = MigrateConfig::from_url(nested).unwrap_err().to_string();
        assert!(error.contains("itself a migration"), "{error}");
    }
}
