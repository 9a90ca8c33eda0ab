//! The backend's ZooKeeper session: one per backend, shared by all its locks, replaced by a new
//! one after it expires; and the counters of the requests sent through it ([`OpCounts`]).

use std::{
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use lock_core::LockError;
use serde::{Deserialize, Serialize};
use zookeeper_client::{
    self as zk, Acls, Client, CreateMode, CreateOptions, CreateSequence, OneshotWatcher, SessionId,
    SessionState, Stat,
};

use crate::ZkConfig;

/// Ephemeral sequential nodes with an open ACL (Curator's default as well).
pub(crate) const CONTENDER: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
/// The container node of one lock: the server deletes it once its last child is gone.
pub(crate) const CONTAINER: CreateOptions<'static> =
    CreateMode::Container.with_acls(Acls::anyone_all());
/// The root node (persistent).
pub(crate) const ROOT: CreateOptions<'static> =
    CreateMode::Persistent.with_acls(Acls::anyone_all());

/// How many ZooKeeper requests a backend sent, by kind, since it was created.
///
/// The recipe's cost is visible here: an uncontended acquisition is one `create` and one
/// `list` (sent together), a release one `delete`, a renewal one `exists`; a waiter adds one
/// `watch` of its predecessor and one `list` each time that predecessor goes. Pings and
/// session management are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OpCounts {
    /// `create` requests (contender nodes, container and root nodes).
    pub creates: u64,
    /// `getChildren` requests of lock paths.
    pub lists: u64,
    /// `getData` requests that set a watch on a predecessor.
    pub watches: u64,
    /// `getData` requests without a watch (`inspect`).
    pub reads: u64,
    /// `exists` requests (renewals, recovery after a lost reply).
    pub exists: u64,
    /// `delete` requests.
    pub deletes: u64,
    /// `sync` requests (`inspect` reads the leader's latest state).
    pub syncs: u64,
}

impl OpCounts {
    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.creates
            + self.lists
            + self.watches
            + self.reads
            + self.exists
            + self.deletes
            + self.syncs
    }
}

/// Field by field: the requests of several backends together.
impl std::ops::Add for OpCounts {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            creates: self.creates + other.creates,
            lists: self.lists + other.lists,
            watches: self.watches + other.watches,
            reads: self.reads + other.reads,
            exists: self.exists + other.exists,
            deletes: self.deletes + other.deletes,
            syncs: self.syncs + other.syncs,
        }
    }
}

impl std::iter::Sum for OpCounts {
    fn sum<I: Iterator<Item = Self>>(counts: I) -> Self {
        counts.fold(Self::default(), |sum, c| sum + c)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    creates: AtomicU64,
    lists: AtomicU64,
    watches: AtomicU64,
    reads: AtomicU64,
    exists: AtomicU64,
    deletes: AtomicU64,
    syncs: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> OpCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OpCounts {
            creates: get(&self.creates),
            lists: get(&self.lists),
            watches: get(&self.watches),
            reads: get(&self.reads),
            exists: get(&self.exists),
            deletes: get(&self.deletes),
            syncs: get(&self.syncs),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One session's client with counted requests, shared as `Arc<Conn>` (the client, with its
/// credentials, is not copied per use).
///
/// Every method sends its request when called (not when the future is first polled), as the
/// client does, so requests reach the server in call order: a `list` called right after a
/// `create` sees the created node.
#[derive(Debug)]
pub(crate) struct Conn {
    client: Client,
    counters: Arc<Counters>,
    /// The TTL of the session's leases ([`ZkConfig::lease_ttl`](crate::ZkConfig::lease_ttl)).
    lease_ttl: Duration,
}

type ZkResult<T> = Result<T, zk::Error>;

impl Conn {
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn id(&self) -> SessionId {
        self.client.session_id()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// The TTL of the leases this session holds: the session timeout less half a server tick.
    pub(crate) fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    pub(crate) fn state(&self) -> SessionState {
        self.client.state()
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.state().is_terminated()
    }

    pub(crate) fn create<'a>(
        &'a self,
        path: &'a str,
        data: &[u8],
        options: &CreateOptions<'_>,
    ) -> impl Future<Output = ZkResult<(Stat, CreateSequence)>> + Send + use<'a> {
        bump(&self.counters.creates);
        self.client.create(path, data, options)
    }

    pub(crate) fn list<'a>(
        &'a self,
        path: &str,
    ) -> impl Future<Output = ZkResult<Vec<String>>> + Send + use<'a> {
        bump(&self.counters.lists);
        self.client.list_children(path)
    }

    pub(crate) fn watch<'a>(
        &'a self,
        path: &str,
    ) -> impl Future<Output = ZkResult<(Vec<u8>, Stat, OneshotWatcher)>> + Send + use<'a> {
        bump(&self.counters.watches);
        self.client.get_and_watch_data(path)
    }

    pub(crate) fn read(
        &self,
        path: &str,
    ) -> impl Future<Output = ZkResult<(Vec<u8>, Stat)>> + Send + use<> {
        bump(&self.counters.reads);
        self.client.get_data(path)
    }

    pub(crate) fn exists(
        &self,
        path: &str,
    ) -> impl Future<Output = ZkResult<Option<Stat>>> + Send + use<> {
        bump(&self.counters.exists);
        self.client.check_stat(path)
    }

    pub(crate) fn delete(&self, path: &str) -> impl Future<Output = ZkResult<()>> + Send + use<> {
        bump(&self.counters.deletes);
        self.client.delete(path, None)
    }

    pub(crate) fn sync<'a>(
        &'a self,
        path: &str,
    ) -> impl Future<Output = ZkResult<()>> + Send + use<'a> {
        bump(&self.counters.syncs);
        self.client.sync(path)
    }
}

/// The backend's session: the current one, and how to open the next.
#[derive(Debug)]
pub(crate) struct Sessions {
    config: ZkConfig,
    current: Mutex<Arc<Conn>>,
    reconnecting: tokio::sync::Mutex<()>,
    counters: Arc<Counters>,
}

impl Sessions {
    /// Opens the first session.
    pub(crate) async fn connect(config: ZkConfig) -> Result<Self, LockError> {
        config.validate()?;
        let counters = Arc::new(Counters::default());
        let conn = open(&config, &counters).await?;
        Ok(Self {
            config,
            current: Mutex::new(Arc::new(conn)),
            reconnecting: tokio::sync::Mutex::new(()),
            counters,
        })
    }

    pub(crate) fn config(&self) -> &ZkConfig {
        &self.config
    }

    pub(crate) fn counts(&self) -> OpCounts {
        self.counters.snapshot()
    }

    /// The current session, even if it has ended.
    pub(crate) fn peek(&self) -> Arc<Conn> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A live session: the current one, or a new one if it has ended.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when no new session could be established.
    pub(crate) async fn live(&self) -> Result<Arc<Conn>, LockError> {
        let conn = self.peek();
        if !conn.is_ended() {
            return Ok(conn);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        let conn = self.peek();
        if !conn.is_ended() {
            return Ok(conn);
        }
        let old = conn.id();
        let conn = Arc::new(open(&self.config, &self.counters).await?);
        tracing::info!(old = %old, new = %conn.id(), "ZooKeeper session ended; opened a new one");
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = conn.clone();
        Ok(conn)
    }
}

async fn open(config: &ZkConfig, counters: &Arc<Counters>) -> Result<Conn, LockError> {
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_fail_eagerly();
    if let Some(auth) = &config.auth {
        connector = connector.with_auth(&auth.scheme, auth.credentials.as_bytes());
    }
    let hosts = config.hosts.as_str();
    match tokio::time::timeout(config.connect_timeout, connector.connect(hosts)).await {
        Ok(Ok(client)) => {
            tracing::debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "ZooKeeper session established");
            Ok(Conn {
                lease_ttl: config.lease_ttl(client.session_timeout()),
                client,
                counters: counters.clone(),
            })
        }
        Ok(Err(error)) => Err(LockError::unavailable(
            format!("cannot establish a ZooKeeper session with `{hosts}`: {error}"),
            error,
        )),
        Err(_) => Err(LockError::unavailable_msg(format!(
            "cannot establish a ZooKeeper session with `{hosts}` within {:?}",
            config.connect_timeout
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_field_by_field() {
        let one = OpCounts {
            creates: 1,
            lists: 2,
            watches: 3,
            reads: 4,
            exists: 5,
            deletes: 6,
            syncs: 7,
        };
        let three: OpCounts = [one, one, one].into_iter().sum();
        assert_eq!(
            three,
            OpCounts {
                creates: 3,
                lists: 6,
                watches: 9,
                reads: 12,
                exists: 15,
                deletes: 18,
                syncs: 21,
            }
        );
        assert_eq!(three.total(), 3 * one.total());
        assert_eq!(std::iter::empty().sum::<OpCounts>(), OpCounts::default());
    }
}
