//! [`LockAdmin`] for Redis and Redlock: held locks are found with `SCAN` (on every master of
//! a cluster, on every server of Redlock) and read as `inspect` reads one; a forced release
//! runs the owner-only release with the holder's own token (so the waiters are told, as by
//! any release). Its floor is the evicted fence plus one: no counter needs raising, since
//! every later fence is at least `counter + 1` (`max(counter + 1, server time in µs)`, and on
//! Redlock the client's floor too) over a counter already at the evicted fence.

use lock_core::{
    Fence, Forced, HeldLock, LockAdmin, LockBackend, LockError, LockInfo, LockName,
    backend::{StoreUrl, async_trait},
};
use redis::aio::ConnectionLike;

use crate::{
    RedisBackend, RedlockBackend,
    config::node_url,
    connection::{Conn, TlsRoots, client},
    error::Error,
    keys::{RedisKeys as Keys, decode},
    ops,
};

/// How often a forced release reads and releases again when the lock changed hands in
/// between (a release runs with the token read just before).
const TRIES: usize = 5;

/// `*`, `?`, `[`, `]` and `\` of `text` escaped for a `SCAN MATCH` pattern.
fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The `SCAN MATCH` pattern of the lock keys under `key_prefix` whose names start with
/// `name_prefix`.
fn pattern(key_prefix: &str, name_prefix: &str) -> String {
    let tag_start = Keys::tag_of(name_prefix);
    format!(
        "{}:{{{}*}}:lock",
        glob_escaped(key_prefix),
        glob_escaped(&tag_start)
    )
}

/// The lock name of a lock key under `key_prefix`; `None` for another key.
fn name_of(key_prefix: &str, key: &str) -> Option<LockName> {
    let tag = key
        .strip_prefix(key_prefix)?
        .strip_prefix(":{")?
        .strip_suffix("}:lock")?;
    LockName::new(decode(tag)?).ok()
}

/// The lock names `SCAN` finds on one server.
///
/// Every `SCAN` call is bounded by `each` when given (Redlock's patience for one server's
/// answer: a whole scan of a large keyspace takes longer than one request may).
async fn scan<C: ConnectionLike + Send>(
    conn: &mut C,
    key_prefix: &str,
    name_prefix: &str,
    each: Option<std::time::Duration>,
) -> Result<Vec<LockName>, LockError> {
    let pattern = pattern(key_prefix, name_prefix);
    let mut cursor: u64 = 0;
    let mut names = Vec::new();
    loop {
        let mut call = redis::cmd("SCAN");
        call.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, keys): (u64, Vec<String>) = crate::error::within_limit(
            each,
            "scan for locks",
            call.query_async::<(u64, Vec<String>)>(conn),
        )
        .await?;
        names.extend(keys.iter().filter_map(|k| name_of(key_prefix, k)));
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(names)
}

/// The addresses (`ip:port`) of a cluster's masters, from `CLUSTER NODES`.
fn masters(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            let serving = flags.split(',').any(|f| f == "master")
                && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
            let address = fields.get(1)?.split('@').next()?;
            serving.then(|| address.to_owned())
        })
        .collect()
}

/// `ip:port` as a URL host: an IPv6 address (`CLUSTER NODES` prints it bare) in brackets.
fn url_host(address: &str) -> String {
    match address.rsplit_once(':') {
        Some((ip, port)) if ip.contains(':') && !ip.starts_with('[') => format!("[{ip}]:{port}"),
        _ => address.to_owned(),
    }
}

fn sorted(mut names: Vec<LockName>) -> Vec<LockName> {
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    names
}

/// How many waiters queue for `keys`' lock.
async fn waiters<C: ConnectionLike + Send>(conn: &mut C, keys: &Keys) -> Option<u64> {
    redis::cmd("ZCARD")
        .arg(&keys.queue)
        .query_async::<u64>(conn)
        .await
        .ok()
}

fn held(info: &LockInfo, waiters: Option<u64>) -> HeldLock {
    HeldLock::new(
        info.name.clone(),
        &info.token,
        info.fence,
        info.expires_in,
        waiters,
    )
}

impl RedisBackend {
    /// The names of the locks under this backend's prefix starting with `prefix`, from every
    /// master of a cluster.
    async fn lock_names(&self, prefix: &str) -> Result<Vec<LockName>, LockError> {
        let config = self.config();
        let mut conn = self.conn();
        if !config.cluster {
            return Ok(sorted(
                scan(&mut conn, &config.key_prefix, prefix, None).await?,
            ));
        }
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::new("CLUSTER NODES", e))?;
        // The seed's credentials (every node of a cluster takes the same).
        let seed = config.urls.first().map(String::as_str).unwrap_or_default();
        let userinfo = StoreUrl::parse(seed)?.userinfo_prefix();
        let mut names = Vec::new();
        for address in masters(&nodes) {
            // A cluster is plain (TLS to a cluster is refused by the configuration).
            let url = node_url(false, &userinfo, &url_host(&address), None);
            let mut node = client(&url, &TlsRoots::default())?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| Error::new(format!("connect to cluster node {address}"), e))?;
            names.extend(scan(&mut node, &config.key_prefix, prefix, None).await?);
        }
        Ok(sorted(names))
    }
}

#[async_trait]
impl LockAdmin for RedisBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        self.on_server(async {
            let mut held_locks = Vec::new();
            for name in self.lock_names(prefix).await? {
                let keys = self.keys(&name);
                let mut conn = self.conn();
                if let Some(info) = ops::inspect(&mut conn, &name, &keys).await? {
                    held_locks.push(held(&info, waiters(&mut conn, &keys).await));
                }
            }
            Ok(held_locks)
        })
        .await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        self.on_server(async {
            let keys = self.keys(name);
            let mut conn = self.conn();
            for _ in 0..TRIES {
                let Some(info) = ops::inspect(&mut conn, name, &keys).await? else {
                    return Ok(None);
                };
                let count = waiters(&mut conn, &keys).await;
                if ops::release(&mut conn, &keys, &info.token, self.tell(), self.next()).await? {
                    return Ok(Some(forced(&info, count)));
                }
            }
            Err(changing_hands(name))
        })
        .await
    }
}

/// What a forced release of `info`'s hold answers. The floor is the evicted fence plus one:
/// every later grant's fence is at least `counter + 1` (see `scripts::ACQUIRE`) with the
/// counter at least the evicted fence on every server that granted it.
fn forced(info: &LockInfo, waiters: Option<u64>) -> Forced {
    Forced::new(
        held(info, waiters),
        Fence::new(info.fence.get().saturating_add(1)),
    )
}

fn changing_hands(name: &LockName) -> LockError {
    LockError::unavailable_msg(format!(
        "`{name}` changed hands {TRIES} times while it was being released by force; try again"
    ))
}

#[async_trait]
impl LockAdmin for RedlockBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        let key_prefix = self.key_prefix().to_owned();
        // Each `SCAN` call within the client's patience for one answer, not the whole scan.
        let each = Some(self.patience());
        let found = self
            .everywhere_batched(|mut conn: Conn| {
                let key_prefix = key_prefix.clone();
                async move { scan(&mut conn, &key_prefix, prefix, each).await }
            })
            .await;
        // Every majority meets any `nodes - quorum + 1` servers: with fewer answers a lock held
        // by the silent ones could be missing from the list, which must not say "nothing".
        let nodes = found.len();
        let needed = nodes.saturating_sub(self.quorum()) + 1;
        let answered = found.iter().filter(|scan| scan.is_ok()).count();
        if answered < needed {
            return Err(LockError::unavailable_msg(format!(
                "listing locks: {answered} of {nodes} servers answered; {needed} needed to see \
                 every majority"
            )));
        }
        let mut names = Vec::new();
        for node in found.into_iter().flatten() {
            names.extend(node);
        }
        let mut held_locks = Vec::new();
        for name in sorted(names) {
            // Held where a majority holds one token (as `inspect` judges).
            if let Some(info) = self.inspect(&name).await? {
                held_locks.push(held(&info, None));
            }
        }
        Ok(held_locks)
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        let keys = self.keys(name);
        // The first hold released on any server: a release on a minority may already take
        // the majority away, and then the next look finds nothing held.
        let mut evicted: Option<LockInfo> = None;
        for _ in 0..TRIES {
            let Some(info) = self.inspect(name).await? else {
                return Ok(evicted.map(|info| forced(&info, None)));
            };
            let votes = self.release_everywhere(&keys, &info.token).await;
            let released = votes.iter().filter(|v| matches!(v, Ok(true))).count();
            if released >= self.quorum() {
                return Ok(Some(forced(&info, None)));
            }
            if released > 0 && evicted.is_none() {
                evicted = Some(info);
            }
        }
        Err(changing_hands(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_names_and_addresses() {
        assert_eq!(pattern("app*", "jobs/{x"), r"app\*:{jobs/%7Bx*}:lock");
        let key = Keys::new("app", &LockName::new("jobs/{7}%").unwrap()).lock;
        assert_eq!(name_of("app", &key).unwrap().as_str(), "jobs/{7}%");
        assert!(name_of("app", "app:{x}:fence").is_none());
        assert!(name_of("app", "other:{x}:lock").is_none());
        let nodes = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n\
                     a2 127.0.0.1:7002@17002 slave a1 0 0 1 connected\n\
                     a3 127.0.0.1:7003@17003 master,fail - 0 0 3 connected 5461-10922\n";
        assert_eq!(masters(nodes), ["127.0.0.1:7001"]);
        assert_eq!(url_host("127.0.0.1:7002"), "127.0.0.1:7002");
        assert_eq!(url_host("::1:7002"), "[::1]:7002");
    }
}
