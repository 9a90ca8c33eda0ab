//! [`RedisConfig`] and [`RedlockConfig`]: how to reach the servers and name the keys.

use std::{fmt, path::PathBuf, str::FromStr, time::Duration};

use lock_core::{
    LockError,
    backend::{StoreUrl, redact_url},
};
use serde::{Deserialize, Serialize};

/// Configuration of a [`RedisBackend`](crate::RedisBackend) (one server, or a cluster).
///
/// ```
/// use lock_core::LockError;
/// use lock_redis::RedisConfig;
///
/// let config = RedisConfig::single("redis://:secret@127.0.0.1:6379").key_prefix("app:locks");
/// assert!(!format!("{config:?}").contains("secret"));
/// assert!(matches!(config.key_prefix("bad{prefix").validate(), Err(LockError::InvalidOptions { .. })));
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Server URLs: one for a single server, the seed nodes for a cluster.
    pub urls: Vec<String>,
    /// Whether `urls` are Redis Cluster nodes.
    pub cluster: bool,
    /// Prefix of every key this backend writes (no `{`, `}` or control characters).
    pub key_prefix: String,
    /// Replicas that must acknowledge an acquisition (`WAIT`) before it is granted; single
    /// server only. 0 = none.
    pub replica_acks: u32,
    /// How long to wait for those acknowledgements: at least 1 ms and below
    /// `response_timeout` when `replica_acks` is set.
    #[serde(with = "humantime_serde")]
    pub replica_timeout: Duration,
    /// Time-out of one request to the server.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// For `rediss://` servers: a PEM file of the certificate authorities to trust, in place
    /// of the system's (the URL's `ca_file`). Read at connect.
    pub tls_ca_file: Option<PathBuf>,
    /// Whether this client takes part in hand-overs (on by default; the URL's `hand_over`):
    /// its releases hand the lock over to the first waiter in line, and its waiters may be
    /// handed a lock by any client's release. A lock is handed over only when both the
    /// releasing and the waiting client have it on. One round trip less per hand-off, but a
    /// waiter whose connection the server still counts as open (its process paused, its host
    /// crashed or cut off until TCP keepalive gives up) holds a lock handed to it until its TTL.
    /// Off, this client's waiters get a turn of 100 ms to come for the lock instead, which is all
    /// such a waiter can stall it: worth it with long TTLs. See the crate README, "Hand-over".
    pub hand_over: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            urls: vec!["redis://127.0.0.1:6379".into()],
            cluster: false,
            key_prefix: "lock".into(),
            replica_acks: 0,
            replica_timeout: Duration::from_millis(500),
            response_timeout: Duration::from_secs(2),
            tls_ca_file: None,
            hand_over: true,
        }
    }
}

impl RedisConfig {
    /// One server at `url` (`redis://[user:password@]host:port[/db]`).
    pub fn single(url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            ..Self::default()
        }
    }

    /// A Redis Cluster reached through these seed nodes.
    pub fn cluster<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            cluster: true,
            ..Self::default()
        }
    }

    /// Sets the key prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets whether releases hand the lock over to the first waiter (see
    /// [`hand_over`](Self::hand_over)).
    pub fn hand_over(mut self, on: bool) -> Self {
        self.hand_over = on;
        self
    }

    /// Requires `replicas` replicas to acknowledge each acquisition.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = replicas;
        self.replica_timeout = timeout;
        self
    }

    /// Parses the URL form (also what `parse` and [`FromStr`] read):
    ///
    /// - `redis://[user:password@]host:port[/db]`: one server;
    /// - `rediss://[user:password@]host:port[/db][?ca_file=/path/ca.pem]`: one server over TLS
    ///   (rustls), verified against the system's certificate authorities or those of
    ///   `ca_file` (needs the `tls` feature, on by default);
    /// - `redis+cluster://[user:password@]host:port,host:port,...`: a cluster, through these
    ///   seed nodes (`rediss+cluster://`, a cluster over TLS, is refused: not supported yet);
    ///
    /// with the settings `prefix`, `replica_acks`, `replica_timeout_ms`, `response_timeout_ms`
    /// and `hand_over` (`true` or `false`) in the query.
    ///
    /// ```
    /// use lock_redis::RedisConfig;
    ///
    /// let config: RedisConfig = "redis+cluster://:s3cret@10.0.0.1:7000,10.0.0.2:7000?prefix=app".parse()?;
    /// assert!(config.cluster);
    /// assert_eq!(config.urls, ["redis://:s3cret@10.0.0.1:7000", "redis://:s3cret@10.0.0.2:7000"]);
    /// assert_eq!(config.key_prefix, "app");
    /// assert!("redis://127.0.0.1:6379?prefx=app".parse::<RedisConfig>().is_err());
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming what is wrong: another scheme, no host, several
    /// hosts for one server, a database that is not a number, an unknown or bad setting.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let mut parsed = StoreUrl::parse(url)?;
        let (cluster, tls) = match parsed.scheme() {
            "redis" => (false, false),
            "rediss" => (false, true),
            "redis+cluster" => (true, false),
            "rediss+cluster" => {
                return Err(invalid(
                    "`rediss+cluster://` (a Redis Cluster over TLS) is not supported; TLS is \
                     supported to one server, `rediss://`"
                        .into(),
                ));
            }
            other => {
                return Err(invalid(format!(
                    "`{other}://` is not a Redis URL; expected `redis://host:port[/db]` or \
                     `redis+cluster://host:port,host:port`"
                )));
            }
        };
        let hosts = parsed.require_hosts()?.to_vec();
        let db = database(parsed.path())?;
        if !cluster && hosts.len() > 1 {
            return Err(invalid(format!(
                "`redis://` names {} hosts; one server takes one (a cluster is \
                 `redis+cluster://`, Redlock `redlock://`)",
                hosts.len()
            )));
        }
        if cluster && db.is_some() {
            return Err(invalid(
                "a Redis Cluster has only database 0; the URL names another".into(),
            ));
        }
        let userinfo = parsed.userinfo_prefix();
        let mut config = Self {
            urls: hosts
                .iter()
                .map(|host| node_url(tls, &userinfo, host, db))
                .collect(),
            cluster,
            ..Self::default()
        };
        if let Some(file) = parsed.take("ca_file")? {
            config.tls_ca_file = Some(PathBuf::from(file));
        }
        if let Some(prefix) = parsed.take("prefix")? {
            config.key_prefix = prefix;
        }
        if let Some(acks) = parsed.take_parsed("replica_acks")? {
            config.replica_acks = acks;
        }
        if let Some(timeout) = parsed.take_millis("replica_timeout_ms")? {
            config.replica_timeout = timeout;
        }
        if let Some(timeout) = parsed.take_millis("response_timeout_ms")? {
            config.response_timeout = timeout;
        }
        if let Some(on) = parsed.take_parsed("hand_over")? {
            config.hand_over = on;
        }
        parsed.finish()?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the bad field.
    pub fn validate(&self) -> Result<(), LockError> {
        validate_prefix(&self.key_prefix)?;
        if self.urls.is_empty() {
            return Err(invalid("no server URL given".into()));
        }
        if self.cluster && self.replica_acks > 0 {
            return Err(invalid(
                "replica_acks is supported on a single server, not on a cluster".into(),
            ));
        }
        if self.response_timeout.is_zero() {
            return Err(invalid("response_timeout must be above zero".into()));
        }
        let tls = self.urls.iter().any(|url| is_tls(url));
        if tls && self.cluster {
            return Err(invalid(
                "a Redis Cluster over TLS (`rediss://` seeds) is not supported; TLS is supported \
                 to one server"
                    .into(),
            ));
        }
        if tls && !cfg!(feature = "tls") {
            return Err(invalid(
                "`rediss://` (TLS) needs lock-redis's `tls` feature, which this build lacks".into(),
            ));
        }
        if self.tls_ca_file.is_some() && !tls {
            return Err(invalid(
                "`ca_file` applies to TLS servers (`rediss://`); the URLs given are plain".into(),
            ));
        }
        if self.replica_acks > 0 {
            // `WAIT n 0` blocks for ever; a WAIT that outlives the request's time-out fails
            // instead of counting the replicas.
            if self.replica_timeout < Duration::from_millis(1) {
                return Err(invalid(format!(
                    "replica_timeout is {:?}; with replica_acks it must be at least 1 ms",
                    self.replica_timeout
                )));
            }
            if self.replica_timeout >= self.response_timeout {
                return Err(invalid(format!(
                    "replica_timeout ({:?}) must be below response_timeout ({:?}): the WAIT for \
                     replicas runs within one request",
                    self.replica_timeout, self.response_timeout
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("urls", &redacted(&self.urls))
            .field("cluster", &self.cluster)
            .field("key_prefix", &self.key_prefix)
            .field("replica_acks", &self.replica_acks)
            .field("replica_timeout", &self.replica_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("hand_over", &self.hand_over)
            .finish()
    }
}

/// Configuration of a [`RedlockBackend`](crate::RedlockBackend): N independent servers.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// One URL per independent server (use an odd number, 3 or 5).
    pub urls: Vec<String>,
    /// Prefix of every key (no `{`, `}` or control characters).
    pub key_prefix: String,
    /// Time-out of one request to one server while a majority of the servers answers within
    /// half of it; 50 ms by default. A vote waits this long for a server that does not answer,
    /// on every vote while it does not, and a server that answers later counts as a failed
    /// vote. While a majority answers later than that, the client waits longer, up to
    /// [`longest_wait`](Self::longest_wait) (four times this): a majority of slow servers is
    /// waited for rather than counted as failed on every vote (see the crate's README,
    /// "Patience").
    #[serde(with = "humantime_serde")]
    pub node_timeout: Duration,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            key_prefix: "lock".into(),
            node_timeout: Duration::from_millis(50),
        }
    }
}

impl RedlockConfig {
    /// Redlock over these servers.
    pub fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Sets the key prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets the per-server time-out.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The longest a client waits for one server's answer: four times
    /// [`node_timeout`](Self::node_timeout). It waits longer than the time-out only while a
    /// majority of its servers answers late (see the crate's README, "Patience").
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_redis::RedlockConfig;
    ///
    /// let config = RedlockConfig::new(["redis://a:6379", "redis://b:6379", "redis://c:6379"]);
    /// assert_eq!(config.longest_wait(), Duration::from_millis(200));
    /// ```
    pub fn longest_wait(&self) -> Duration {
        self.node_timeout.saturating_mul(4)
    }

    /// Parses the URL form `redlock://[user:password@]host:port,host:port,...[/db]` with the
    /// settings `prefix` and `node_timeout_ms` in the query (also what `parse` and
    /// [`FromStr`] read); the credentials and database apply to every server.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_redis::RedlockConfig;
    ///
    /// let config: RedlockConfig = "redlock://a:6379,b:6379,c:6379?node_timeout_ms=80".parse()?;
    /// assert_eq!(config.urls, ["redis://a:6379", "redis://b:6379", "redis://c:6379"]);
    /// assert_eq!(config.node_timeout, Duration::from_millis(80));
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming what is wrong.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let mut parsed = StoreUrl::parse(url)?;
        if parsed.scheme() != "redlock" {
            return Err(invalid(format!(
                "`{}://` is not a Redlock URL; expected `redlock://host:port,host:port,host:port`",
                parsed.scheme()
            )));
        }
        let hosts = parsed.require_hosts()?.to_vec();
        let db = database(parsed.path())?;
        let userinfo = parsed.userinfo_prefix();
        let mut config = Self::new(
            hosts
                .iter()
                .map(|host| node_url(false, &userinfo, host, db)),
        );
        if let Some(prefix) = parsed.take("prefix")? {
            config.key_prefix = prefix;
        }
        if let Some(timeout) = parsed.take_millis("node_timeout_ms")? {
            config.node_timeout = timeout;
        }
        parsed.finish()?;
        config.validate()?;
        Ok(config)
    }

    /// The number of servers that must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.urls.len() / 2 + 1
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the bad field.
    pub fn validate(&self) -> Result<(), LockError> {
        validate_prefix(&self.key_prefix)?;
        if self.urls.is_empty() {
            return Err(invalid(
                "Redlock needs at least one server URL (3 or 5 recommended)".into(),
            ));
        }
        if self.node_timeout.is_zero() {
            return Err(invalid("node_timeout must be above zero".into()));
        }
        if self.urls.iter().any(|url| is_tls(url)) {
            return Err(invalid(
                "Redlock over TLS (`rediss://` nodes) is not supported; TLS is supported to \
                 one server"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("urls", &redacted(&self.urls))
            .field("key_prefix", &self.key_prefix)
            .field("node_timeout", &self.node_timeout)
            .finish()
    }
}

impl FromStr for RedisConfig {
    type Err = LockError;
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Self::from_url(url)
    }
}

impl FromStr for RedlockConfig {
    type Err = LockError;
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Self::from_url(url)
    }
}

fn invalid(reason: String) -> LockError {
    LockError::invalid_options(reason)
}

/// The database a URL's path names (`/3`), if any.
fn database(path: &str) -> Result<Option<u32>, LockError> {
    match path.trim_start_matches('/') {
        "" => Ok(None),
        db => db.parse().map(Some).map_err(|_| {
            invalid(format!(
                "the URL's path {path:?} is not a database number (`/0` to `/15` by default)"
            ))
        }),
    }
}

/// Whether `url` names a TLS server (`rediss://`, any case, as the client crate reads it).
pub(crate) fn is_tls(url: &str) -> bool {
    url.get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}

/// The URL of one server for the Redis client (`rediss://` when `tls`).
pub(crate) fn node_url(tls: bool, userinfo: &str, host: &str, db: Option<u32>) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    match db {
        Some(db) => format!("{scheme}://{userinfo}{host}/{db}"),
        None => format!("{scheme}://{userinfo}{host}"),
    }
}

fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
        return Err(invalid(format!(
            "key prefix {prefix:?} may not contain braces or control characters (braces would break the hash tag)"
        )));
    }
    Ok(())
}

/// URLs with any password replaced by `***` (see [`redact_url`]).
pub(crate) fn redacted(urls: &[String]) -> Vec<String> {
    urls.iter().map(|u| redact_url(u)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        let config = RedlockConfig::new(["redis://:hunter2@a:1"]);
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn bad_values_are_named() {
        let err = RedisConfig::single("redis://h")
            .key_prefix("a}b")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("key prefix"));
        let err = RedisConfig::cluster(["redis://h"])
            .replica_acks(1, Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("replica_acks"));
        let err = RedisConfig::single("redis://h")
            .replica_acks(1, Duration::from_secs(2))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("below response_timeout"), "{err}");
        let err = RedisConfig::single("redis://h")
            .replica_acks(1, Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("at least 1 ms"), "{err}");
        assert!(
            RedisConfig::single("redis://h")
                .replica_acks(1, Duration::from_millis(500))
                .validate()
                .is_ok()
        );
        assert!(RedlockConfig::new(Vec::<String>::new()).validate().is_err());
        assert_eq!(RedlockConfig::new(["a", "b", "c", "d", "e"]).quorum(), 3);
    }

    #[test]
    fn url_forms() {
        let config: RedisConfig =
            "redis://:pw@h:1/2?prefix=p&replica_acks=1&replica_timeout_ms=100&response_timeout_ms=900"
                .parse()
                .unwrap();
        let without: RedisConfig = "redis://h:1?hand_over=false".parse().unwrap();
        assert_eq!(config.urls, ["redis://:pw@h:1/2"]);
        assert_eq!((config.key_prefix.as_str(), config.replica_acks), ("p", 1));
        assert_eq!(config.replica_timeout, Duration::from_millis(100));
        assert_eq!(config.response_timeout, Duration::from_millis(900));
        assert!(config.hand_over, "hand-over is on by default");
        assert!(!without.hand_over);
        let redis = |url: &str| url.parse::<RedisConfig>().unwrap_err().to_string();
        let redlock = |url: &str| url.parse::<RedlockConfig>().unwrap_err().to_string();
        for (text, word) in [
            (redis("redis://h:1,h:2"), "one server"),
            (redis("redis://h:1/x"), "database"),
            (redis("redis+cluster://h:1/3"), "database 0"),
            (redis("rediss+cluster://h:1,h:2"), "TLS"),
            (redis("redis://h:1?ca_file=/tmp/ca.pem"), "ca_file"),
            (redis("redlock://h:1"), "not a Redis URL"),
            (redis("redis://"), "no host"),
            (redis("redis://h:1?prefix=a{b"), "key prefix"),
            (
                redis("redis://h:1?response_timeout_ms=0"),
                "response_timeout",
            ),
            (redis("redis://:hunter2@h:1?db=2"), "`db`"),
            (
                redlock("redlock://:hunter2@a:1,b:1?prefix=x&timeout=5"),
                "`timeout`",
            ),
            (
                redlock("redlock://a:1?node_timeout_ms=-5"),
                "node_timeout_ms",
            ),
            (redlock("redis://a:1"), "not a Redlock URL"),
        ] {
            assert!(text.contains(word), "{word}: {text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn config_round_trips_with_defaults() {
        let config: RedisConfig = serde_json::from_str(r#"{"urls":["redis://h:1"]}"#).unwrap();
        assert_eq!(config.key_prefix, "lock");
        assert!(!config.cluster);
        let config: RedlockConfig = serde_json::from_str(
            r#"{"urls":["redis://a","redis://b","redis://c"],"node_timeout":"80ms"}"#,
        )
        .unwrap();
        assert_eq!(config.node_timeout, Duration::from_millis(80));
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(
            serde_json::from_str::<RedlockConfig>(&json).unwrap(),
            config
        );
    }
}
