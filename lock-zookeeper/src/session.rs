//! The backend's ZooKeeper session: one per backend, shared by all its locks, replaced by a new
//! one after it expires. The requests sent through it are counted in [`crate::metrics`].

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use lock_core::LockError;
use zookeeper_client::{
    self as zk, Acls, Client, CreateMode, CreateOptions, CreateSequence, MultiReadResult,
    OneshotWatcher, SessionId, SessionState, Stat,
};

use crate::{
    ZkConfig,
    metrics::{Counters, OpCounts, bump},
};

/// Ephemeral sequential nodes with an open ACL (Curator's default as well).
pub(crate) const CONTENDER: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
/// The container node of one lock: the server deletes it once its last child is gone.
pub(crate) const CONTAINER: CreateOptions<'static> =
    CreateMode::Container.with_acls(Acls::anyone_all());
/// The root node (persistent).
pub(crate) const ROOT: CreateOptions<'static> =
    CreateMode::Persistent.with_acls(Acls::anyone_all());

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

    /// One `multiRead` of the data and stat of every node of `paths` (their errors one by one).
    pub(crate) fn read_many<'a>(
        &'a self,
        paths: &[&str],
    ) -> ZkResult<impl Future<Output = ZkResult<Vec<MultiReadResult>>> + Send + use<'a>> {
        let mut reader = self.client.new_multi_reader();
        for path in paths {
            reader.add_get_data(path)?;
        }
        bump(&self.counters.multi_reads);
        Ok(reader.commit())
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
