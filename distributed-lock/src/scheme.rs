//! [`Scheme`]: the URL schemes, which feature of this crate each needs, and which are
//! compiled in ([`schemes`]).

use std::fmt;

/// A kind of store URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// `memory://[instance]`: an in-process store (always compiled in).
    Memory,
    /// `redis://`: one Redis server (feature `redis`).
    Redis,
    /// `redis+cluster://`: a Redis Cluster (feature `redis`).
    RedisCluster,
    /// `redlock://`: Redlock over independent Redis servers (feature `redis`).
    Redlock,
    /// `mysql://` or `mariadb://` (feature `mysql`).
    MySql,
    /// `zk://` or `zookeeper://` (feature `zookeeper`).
    ZooKeeper,
    /// `migrate://`: a client in one phase of a migration between two of the above (always
    /// compiled in; its stores need theirs).
    Migrate,
}

/// Every scheme, compiled in or not.
pub(crate) const ALL: [Scheme; 7] = [
    Scheme::Memory,
    Scheme::Redis,
    Scheme::RedisCluster,
    Scheme::Redlock,
    Scheme::MySql,
    Scheme::ZooKeeper,
    Scheme::Migrate,
];

impl Scheme {
    /// The scheme of a URL's `scheme` part (lower-case), compiled in or not.
    pub fn from_name(name: &str) -> Option<Self> {
        ALL.into_iter().find(|s| s.names().contains(&name))
    }

    /// The spellings of this scheme (`["zk", "zookeeper"]`), the first the usual one. The TLS
    /// spellings (`rediss`, `rediss+cluster`) are the store's to accept (one server) or
    /// refuse (a cluster).
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Self::Memory => &["memory"],
            Self::Redis => &["redis", "rediss"],
            Self::RedisCluster => &["redis+cluster", "rediss+cluster"],
            Self::Redlock => &["redlock"],
            Self::MySql => &["mysql", "mariadb"],
            Self::ZooKeeper => &["zk", "zookeeper"],
            Self::Migrate => &["migrate"],
        }
    }

    /// The feature of this crate that compiles it in (`None`: always there).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Self::Memory | Self::Migrate => None,
            Self::Redis | Self::RedisCluster | Self::Redlock => Some("redis"),
            Self::MySql => Some("mysql"),
            Self::ZooKeeper => Some("zookeeper"),
        }
    }

    /// Whether this build has it.
    pub fn is_compiled_in(self) -> bool {
        match self {
            Self::Memory | Self::Migrate => true,
            Self::Redis | Self::RedisCluster | Self::Redlock => cfg!(feature = "redis"),
            Self::MySql => cfg!(feature = "mysql"),
            Self::ZooKeeper => cfg!(feature = "zookeeper"),
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.names()[0])
    }
}

/// The schemes this build can connect to.
///
/// ```
/// use distributed_lock::{Scheme, schemes};
///
/// assert!(schemes().contains(&Scheme::Memory));
/// ```
pub fn schemes() -> Vec<Scheme> {
    ALL.into_iter().filter(|s| s.is_compiled_in()).collect()
}

/// The schemes of this build, as text (`memory://, redis://, ...`).
pub(crate) fn compiled_in_list() -> String {
    schemes()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
