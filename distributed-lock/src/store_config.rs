//! [`StoreConfig`]: which store and its settings, from a URL (`FromStr`) or from a config
//! file (serde), and how to connect to it.

use std::{fmt, str::FromStr, sync::Arc};

use lock_core::{
    LockAdmin, LockBackend, LockClient, LockError,
    backend::{StoreUrl, redact_url},
};
#[cfg(feature = "mysql")]
use lock_mysql::{MySqlBackend, MySqlConfig};
#[cfg(feature = "redis")]
use lock_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
#[cfg(feature = "zookeeper")]
use lock_zookeeper::{ZkBackend, ZkConfig};
use serde::{Deserialize, Serialize};

use crate::{
    MigrateConfig, Requirement, memory,
    requirement::{self, parse_list},
    scheme::{Scheme, compiled_in_list},
};

/// Which store, with the settings its own crate defines (each store crate owns its URL form
/// and serde).
///
/// Serde reads it tagged by `store`: `{"store": "redis", "urls": ["redis://10.0.0.1:6379"]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "store", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Store {
    /// An in-process store; clients naming the same `instance` share it.
    Memory {
        /// The instance's name (`""`: the default one).
        #[serde(default)]
        instance: String,
    },
    /// One Redis server or a cluster (`redis://`, `redis+cluster://`).
    #[cfg(feature = "redis")]
    Redis(RedisConfig),
    /// Redlock over independent Redis servers (`redlock://`).
    #[cfg(feature = "redis")]
    Redlock(RedlockConfig),
    /// MySQL or MariaDB (`mysql://`, `mariadb://`).
    #[cfg(feature = "mysql")]
    Mysql(MySqlConfig),
    /// ZooKeeper (`zk://`, `zookeeper://`).
    #[cfg(feature = "zookeeper")]
    Zookeeper(ZkConfig),
    /// A client in one phase of a migration between two stores (`migrate://`).
    Migrate(MigrateConfig),
}

/// A connected store: the lock contract and the operator's view of it ([`LockAdmin`]), which
/// every store of this workspace has. An `Arc<dyn AdminBackend>` is an `Arc<dyn LockBackend>`
/// and an `Arc<dyn LockAdmin>` too.
pub trait AdminBackend: LockBackend + LockAdmin {}

impl<T: LockBackend + LockAdmin> AdminBackend for T {}

/// A store and the safety properties the configuration requires of it.
///
/// The URL form is the store's own URL, plus `require=` (a comma-separated list of
/// [`Requirement`]s) in its query:
///
/// ```
/// use distributed_lock::{Requirement, Store, StoreConfig};
///
/// let config: StoreConfig = "memory://tests?require=strict-fencing,fifo".parse()?;
/// assert!(matches!(&config.store, Store::Memory { instance } if instance == "tests"));
/// assert_eq!(config.require, [Requirement::StrictFencing, Requirement::Fifo]);
///
/// // The same as a config file reads it.
/// let json = r#"{ "store": "memory", "instance": "tests", "require": ["strict-fencing", "fifo"] }"#;
/// let from_file: StoreConfig = serde_json::from_str(json)?;
/// assert_eq!(from_file, config);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// `Debug` and `Display` never show a password.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreConfig {
    /// The store.
    #[serde(flatten)]
    pub store: Store,
    /// What the store must declare; [`StoreConfig::connect`] refuses a store that does not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require: Vec<Requirement>,
}

fn invalid(reason: String) -> LockError {
    LockError::invalid_options(reason)
}

/// `url` without its `require=` parameter, and that parameter's value.
fn split_require(url: &str) -> Result<(String, Option<String>), LockError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut require = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("require", value)) => {
                if require.replace(value.to_owned()).is_some() {
                    return Err(invalid("store URL: `require` is given twice".into()));
                }
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, require))
}

/// The error for a scheme this build lacks.
fn not_compiled(scheme: Scheme) -> LockError {
    invalid(format!(
        "the scheme `{scheme}` needs the `{}` feature of distributed-lock, which this build \
         does not have; it has: {}",
        scheme.feature().unwrap_or("default"),
        compiled_in_list()
    ))
}

impl Store {
    /// Parses a store URL (without `require=`; see [`StoreConfig`]).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] saying what is wrong: an unknown scheme (with the list
    /// this build has), a scheme whose feature is off, or whatever the store's parser finds.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let parsed = StoreUrl::parse(url)?;
        let Some(scheme) = Scheme::from_name(parsed.scheme()) else {
            return Err(invalid(format!(
                "store URL: `{}://` is no store this library knows; it knows {}",
                parsed.scheme(),
                compiled_in_list()
            )));
        };
        if !scheme.is_compiled_in() {
            return Err(not_compiled(scheme));
        }
        match scheme {
            Scheme::Memory => {
                if parsed.hosts().len() > 1 || !parsed.path().is_empty() {
                    return Err(invalid(
                        "store URL: `memory://` takes one instance name at most \
                         (`memory://name`), no path"
                            .into(),
                    ));
                }
                let instance = parsed.hosts().first().cloned().unwrap_or_default();
                parsed.finish()?;
                Ok(Self::Memory { instance })
            }
            #[cfg(feature = "redis")]
            Scheme::Redis | Scheme::RedisCluster => Ok(Self::Redis(RedisConfig::from_url(url)?)),
            #[cfg(feature = "redis")]
            Scheme::Redlock => Ok(Self::Redlock(RedlockConfig::from_url(url)?)),
            #[cfg(feature = "mysql")]
            Scheme::MySql => Ok(Self::Mysql(MySqlConfig::from_url(url)?)),
            #[cfg(feature = "zookeeper")]
            Scheme::ZooKeeper => Ok(Self::Zookeeper(url.parse()?)),
            Scheme::Migrate => Ok(Self::Migrate(MigrateConfig::from_url(url)?)),
            #[allow(unreachable_patterns)]
            other => Err(not_compiled(other)),
        }
    }

    /// A short name of the store for messages (`redis`, `mysql (row-lock)`, ...).
    pub fn label(&self) -> String {
        match self {
            Self::Memory { .. } => "memory".into(),
            #[cfg(feature = "redis")]
            Self::Redis(c) if c.cluster => "redis+cluster".into(),
            #[cfg(feature = "redis")]
            Self::Redis(_) => "redis".into(),
            #[cfg(feature = "redis")]
            Self::Redlock(_) => "redlock".into(),
            #[cfg(feature = "mysql")]
            Self::Mysql(c) => format!("mysql ({})", c.strategy),
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(c) if c.host_count() > 1 => "zookeeper (ensemble)".into(),
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(_) => "zookeeper (one server)".into(),
            Self::Migrate(m) => format!("migration ({})", m.phase),
        }
    }

    /// Connects to the store.
    ///
    /// # Errors
    /// Whatever the store's `connect` answers (an unreachable store is
    /// [`LockError::Unavailable`]).
    pub async fn backend(&self) -> Result<Arc<dyn AdminBackend>, LockError> {
        Ok(match self {
            Self::Memory { instance } => Arc::new(memory::instance(instance)),
            #[cfg(feature = "redis")]
            Self::Redis(config) => Arc::new(RedisBackend::connect(config.clone()).await?),
            #[cfg(feature = "redis")]
            Self::Redlock(config) => Arc::new(RedlockBackend::connect(config.clone()).await?),
            #[cfg(feature = "mysql")]
            Self::Mysql(config) => Arc::new(MySqlBackend::connect(config).await?),
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(config) => Arc::new(ZkBackend::connect(config.clone()).await?),
            Self::Migrate(config) => Arc::new(config.backend().await?),
        })
    }
}

impl StoreConfig {
    /// Connects to the store and checks that it declares every [`StoreConfig::require`]d
    /// property (the store's declared capabilities can depend on the server, as MySQL's
    /// fencing does on its durability settings, so they are read after connecting; nothing
    /// is locked before the check).
    ///
    /// # Errors
    /// Whatever the store's `connect` answers, or [`LockError::InvalidOptions`] naming each
    /// missing property and the stores that have it.
    pub async fn backend(&self) -> Result<Arc<dyn AdminBackend>, LockError> {
        let backend = self.store.backend().await?;
        requirement::check(&self.store.label(), &backend.capabilities(), &self.require)?;
        Ok(backend)
    }

    /// Connects as [`StoreConfig::backend`] does, and makes a client of it.
    ///
    /// # Errors
    /// As [`StoreConfig::backend`].
    pub async fn connect(&self) -> Result<LockClient, LockError> {
        let backend: Arc<dyn LockBackend> = self.backend().await?;
        Ok(LockClient::new(backend))
    }
}

impl FromStr for StoreConfig {
    type Err = LockError;
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        // The shared checks first (length, characters), before the query is split.
        StoreUrl::parse(url)?;
        let (url, require) = split_require(url)?;
        let require = match require {
            Some(list) => parse_list(&list)?,
            None => Vec::new(),
        };
        Ok(Self {
            store: Store::from_url(&url)?,
            require,
        })
    }
}

impl FromStr for Store {
    type Err = LockError;
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Self::from_url(url)
    }
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory { instance } => write!(f, "memory://{instance}"),
            #[cfg(feature = "redis")]
            Self::Redis(c) => write!(f, "{} at {}", self.label(), redacted(&c.urls)),
            #[cfg(feature = "redis")]
            Self::Redlock(c) => write!(f, "redlock over {}", redacted(&c.urls)),
            #[cfg(feature = "mysql")]
            Self::Mysql(c) => write!(f, "{} at {}", self.label(), redact_url(&c.url)),
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(c) => write!(f, "{} at {}{}", self.label(), c.hosts, c.root),
            Self::Migrate(c) => write!(f, "{c}"),
        }
    }
}

impl fmt::Display for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.store)?;
        if !self.require.is_empty() {
            let list: Vec<&str> = self.require.iter().map(|r| r.as_str()).collect();
            write!(f, " (requiring {})", list.join(", "))?;
        }
        Ok(())
    }
}

/// URLs with their passwords replaced, joined.
#[allow(dead_code)] // Used by the store variants of some feature sets only.
fn redacted(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redact_url(u))
        .collect::<Vec<_>>()
        .join(", ")
}
