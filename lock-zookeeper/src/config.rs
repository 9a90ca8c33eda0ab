//! [`ZkConfig`] and [`ZkAuth`]: where the ensemble is, where locks live, how long a session
//! lasts.

use std::{fmt, str::FromStr, time::Duration};

use lock_core::{Failover, LockError, LockName, backend::StoreUrl};
use serde::{Deserialize, Serialize};

use crate::encoding::encode_name;

/// How to reach ZooKeeper and where to keep locks.
///
/// Serde reads every field with a default (`#[serde(default)]`), durations as text such as
/// `"4s"` (as in every config of this workspace):
///
/// ```
/// use std::time::Duration;
/// use lock_zookeeper::ZkConfig;
///
/// let config: ZkConfig = serde_json::from_str(
///     r#"{ "hosts": "10.0.0.1:2181,10.0.0.2:2181", "session_timeout": "4s" }"#,
/// )?;
/// assert_eq!(config.root, "/locks");
/// assert_eq!(config.session_timeout, Duration::from_secs(4));
///
/// // The URL form: credentials, hosts, the lock root as the path, options as the query.
/// let config: ZkConfig = "zk://app:s3cret@10.0.0.1:2181,10.0.0.2:2181/app/locks?session_timeout_ms=4000"
///     .parse()?;
/// assert_eq!(config.hosts, "10.0.0.1:2181,10.0.0.2:2181");
/// assert_eq!(config.root, "/app/locks");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// `Debug` shows every field; [`ZkAuth`]'s own `Debug` keeps the credentials out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ZkConfig {
    /// The connect string: `host:port` pairs separated by commas, as every ZooKeeper client
    /// takes it (a trailing `/chroot` is allowed and applies to every path).
    pub hosts: String,
    /// The persistent node under which every lock has its container node (default `/locks`).
    pub root: String,
    /// The session timeout asked of the server (default 10 s). The server clamps it to its
    /// `minSessionTimeout..=maxSessionTimeout` (by default 2 to 20 ticks); leases carry the
    /// negotiated value.
    #[serde(with = "humantime_serde")]
    pub session_timeout: Duration,
    /// How long establishing a session may take before `connect` gives up (default 10 s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// What [`Capabilities::failover`](lock_core::Capabilities::failover) declares; `None`
    /// derives it from the connect string: one host is a single server, several are a quorum.
    pub failover: Option<Failover>,
    /// The servers' `tickTime`, if you know it. In an ensemble the leader expires sessions
    /// and learns of a session's requests to a follower only from that follower's next ping
    /// answer, up to half a tick later; every lease leaves half a tick out of the session
    /// timeout so the guard's local deadline never outlives the leader's view of the session.
    /// `None` (the default) assumes the most it can be: half the negotiated session timeout
    /// (the server never negotiates less than two ticks), so a quarter is left out.
    #[serde(with = "humantime_serde")]
    pub server_tick: Option<Duration>,
    /// Credentials sent with every session (`addauth`), if any.
    pub auth: Option<ZkAuth>,
}

impl Default for ZkConfig {
    fn default() -> Self {
        Self {
            hosts: "127.0.0.1:2181".into(),
            root: "/locks".into(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            failover: None,
            server_tick: None,
            auth: None,
        }
    }
}

impl ZkConfig {
    /// The defaults with the connect string `hosts`.
    pub fn new(hosts: impl Into<String>) -> Self {
        Self {
            hosts: hosts.into(),
            ..Self::default()
        }
    }

    /// Sets the root node of locks.
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Sets the session timeout to ask for.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets how long connecting may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Declares the failover behaviour instead of deriving it from the host count.
    pub fn failover(mut self, failover: Failover) -> Self {
        self.failover = Some(failover);
        self
    }

    /// Sets the servers' `tickTime` (see [`ZkConfig::server_tick`]).
    pub fn server_tick(mut self, tick: Duration) -> Self {
        self.server_tick = Some(tick);
        self
    }

    /// The TTL of every lease on a session of `session_timeout` (negotiated): the timeout less
    /// half a server tick (see [`ZkConfig::server_tick`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_zookeeper::ZkConfig;
    ///
    /// let session = Duration::from_secs(10);
    /// assert_eq!(ZkConfig::default().lease_ttl(session), Duration::from_millis(7500));
    /// let known = ZkConfig::default().server_tick(Duration::from_secs(2));
    /// assert_eq!(known.lease_ttl(session), Duration::from_secs(9));
    /// ```
    pub fn lease_ttl(&self, session_timeout: Duration) -> Duration {
        let half_tick = self
            .server_tick
            .map_or(session_timeout / 4, |tick| tick / 2)
            .min(session_timeout / 4);
        session_timeout.saturating_sub(half_tick)
    }

    /// Sets the credentials sent with every session.
    pub fn auth(mut self, auth: ZkAuth) -> Self {
        self.auth = Some(auth);
        self
    }

    /// The node path of `name`'s lock: `<root>/<name, percent-encoded into one segment>`.
    ///
    /// ```
    /// use lock_core::LockName;
    /// use lock_zookeeper::ZkConfig;
    ///
    /// // Bytes outside `A-Z a-z 0-9 - . _ ~` are written as %XX: one name, one segment.
    /// let name = LockName::new("billing/run 7")?;
    /// assert_eq!(ZkConfig::default().lock_path(&name), "/locks/billing%2Frun%207");
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    pub fn lock_path(&self, name: &LockName) -> String {
        format!("{}/{}", self.root, encode_name(name))
    }

    /// The number of servers in the connect string.
    pub fn host_count(&self) -> usize {
        let hosts = self.hosts.split('/').next().unwrap_or_default();
        hosts.split(',').filter(|h| !h.trim().is_empty()).count()
    }

    /// The declared or derived failover behaviour.
    pub fn effective_failover(&self) -> Failover {
        self.failover.unwrap_or(if self.host_count() > 1 {
            Failover::Quorum
        } else {
            Failover::SingleServer
        })
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the value, what it was and what is allowed.
    pub fn validate(&self) -> Result<(), LockError> {
        let invalid = |reason: String| Err(LockError::invalid_options(reason));
        if self.host_count() == 0 {
            return invalid(format!(
                "ZooKeeper hosts {:?} name no server; expected `host:port[,host:port...]`",
                self.hosts
            ));
        }
        let root = &self.root;
        let bad_segment = root
            .split('/')
            .skip(1)
            .any(|s| s.is_empty() || s == "." || s == "..");
        if !root.starts_with('/') || root == "/" || bad_segment {
            return invalid(format!(
                "ZooKeeper lock root {root:?} is not a node path; expected an absolute path such as `/locks` (no trailing `/`, no empty, `.` or `..` segments)"
            ));
        }
        if let Some(c) = root.chars().find(|c| c.is_control()) {
            return invalid(format!(
                "ZooKeeper lock root {root:?} contains the control character U+{:04X}",
                u32::from(c)
            ));
        }
        if self.session_timeout < Duration::from_millis(1)
            || self.session_timeout > Duration::from_secs(3600)
        {
            return invalid(format!(
                "session timeout is {:?}; it must be between 1 ms and 1 h (the server clamps it further)",
                self.session_timeout
            ));
        }
        if self.connect_timeout.is_zero() {
            return invalid("connect timeout is zero; it must be above zero".into());
        }
        Ok(())
    }
}

/// Parses the URL form
/// `zk://[user:password@]host:port[,host:port...][/lock/root][?session_timeout_ms=N&connect_timeout_ms=N&failover=quorum|single]`
/// (`zookeeper://` too).
///
/// `user:password` becomes `digest` credentials (percent-decoded); the path is the lock root
/// (default `/locks`); `failover` sets [`ZkConfig::failover`]. Any other setting is an error
/// that names it.
impl FromStr for ZkConfig {
    type Err = LockError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| LockError::InvalidOptions {
            reason: format!(
                "ZooKeeper URL: {reason}; expected `zk://[user:password@]host:port[,host:port...][/root][?session_timeout_ms=N]`"
            ),
        };
        let mut parsed = StoreUrl::parse(url)?;
        if !matches!(parsed.scheme(), "zk" | "zookeeper") {
            return Err(invalid(format!(
                "`{}://` is not `zk://` or `zookeeper://`",
                parsed.scheme()
            )));
        }
        let mut config = Self::new(parsed.require_hosts()?.join(","));
        if !parsed.path().is_empty() {
            config.root = parsed.path().to_owned();
        }
        if parsed.user().is_some() || parsed.password().is_some() {
            config.auth = Some(ZkAuth::digest(
                parsed.user().unwrap_or(""),
                parsed.password().unwrap_or(""),
            ));
        }
        if let Some(timeout) = parsed.take_millis("session_timeout_ms")? {
            config.session_timeout = timeout;
        }
        if let Some(timeout) = parsed.take_millis("connect_timeout_ms")? {
            config.connect_timeout = timeout;
        }
        if let Some(failover) = parsed.take("failover")? {
            config.failover = Some(match failover.as_str() {
                "quorum" => Failover::Quorum,
                "single" => Failover::SingleServer,
                other => {
                    return Err(invalid(format!(
                        "`failover={other}`: it must be `quorum` or `single`"
                    )));
                }
            });
        }
        parsed.finish()?;
        config.validate()?;
        Ok(config)
    }
}

/// Credentials for ZooKeeper's `addauth` (for example `digest` with `user:password`).
///
/// `Debug` never shows the credentials.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ZkAuth {
    /// The authentication scheme (`digest`, ...).
    pub scheme: String,
    /// The scheme's credentials (for `digest`: `user:password`).
    pub credentials: String,
}

impl ZkAuth {
    /// Credentials of `scheme`.
    pub fn new(scheme: impl Into<String>, credentials: impl Into<String>) -> Self {
        Self {
            scheme: scheme.into(),
            credentials: credentials.into(),
        }
    }

    /// `digest` credentials for `user` with `password`.
    pub fn digest(user: &str, password: &str) -> Self {
        Self::new("digest", format!("{user}:{password}"))
    }
}

impl fmt::Debug for ZkAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkAuth")
            .field("scheme", &self.scheme)
            .field("credentials", &"***")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_failover_is_derived() {
        let config = ZkConfig::default();
        config.validate().unwrap();
        assert_eq!(config.effective_failover(), Failover::SingleServer);
        let ensemble = ZkConfig::new("a:1,b:2,c:3/chroot");
        assert_eq!(ensemble.host_count(), 3);
        assert_eq!(ensemble.effective_failover(), Failover::Quorum);
        let declared = ZkConfig::new("vip:2181").failover(Failover::Quorum);
        assert_eq!(declared.effective_failover(), Failover::Quorum);
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (ZkConfig::new(""), "hosts"),
            (ZkConfig::new("a:1").root("locks"), "root"),
            (ZkConfig::new("a:1").root("/"), "root"),
            (ZkConfig::new("a:1").root("/locks/"), "root"),
            (ZkConfig::new("a:1").root("/a//b"), "root"),
            (ZkConfig::new("a:1").root("/a/.."), "root"),
            (ZkConfig::new("a:1").root("/a\nb"), "control"),
            (
                ZkConfig::new("a:1").session_timeout(Duration::ZERO),
                "session timeout",
            ),
            (
                ZkConfig::new("a:1").connect_timeout(Duration::ZERO),
                "connect timeout",
            ),
        ];
        for (config, word) in cases {
            let err = config.validate().unwrap_err();
            assert!(matches!(err, LockError::InvalidOptions { .. }));
            assert!(err.to_string().contains(word), "{err} should name {word}");
        }
    }

    #[test]
    fn serde_round_trip_with_text_durations() {
        let config = ZkConfig::new("h:1")
            .session_timeout(Duration::from_millis(2500))
            .auth(ZkAuth::digest("u", "p"));
        let json = serde_json::to_string(&config).unwrap();
        assert!(json.contains(r#""session_timeout":"2s 500ms""#), "{json}");
        let back: ZkConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, config);
        let partial: ZkConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(partial, ZkConfig::default());
    }

    #[test]
    fn url_form() {
        let config: ZkConfig =
            "zk://u%40x:p%3Aw@h1:1,h2:2/a/locks?session_timeout_ms=3000&connect_timeout_ms=500"
                .parse()
                .unwrap();
        assert_eq!(config.hosts, "h1:1,h2:2");
        assert_eq!(config.root, "/a/locks");
        assert_eq!(config.session_timeout, Duration::from_secs(3));
        assert_eq!(config.connect_timeout, Duration::from_millis(500));
        assert_eq!(config.auth, Some(ZkAuth::digest("u@x", "p:w")));
        let plain: ZkConfig = "zk://h:1".parse().unwrap();
        assert_eq!(plain.root, "/locks");
        assert_eq!(plain.auth, None);
        for bad in [
            "http://h:1",
            "zk://h:1?nope=1",
            "zk://h:1?session_timeout_ms=x",
            "zk:///locks",
        ] {
            assert!(bad.parse::<ZkConfig>().is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_hides_credentials() {
        let config = ZkConfig::new("h:1").auth(ZkAuth::digest("user", "hunter2"));
        let text = format!("{config:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("***"), "{text}");
    }
}
