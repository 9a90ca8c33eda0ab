//! What the conformance suite and the fault tests share: the [`ZkStore`] test store and raw
//! ZooKeeper access.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::{sync::Arc, time::Duration};

use conformance_tests::{Failure, Services, TestStore, faults::env_var};
use lock_core::{LockAdmin, LockClient, LockError, LockName, backend::async_trait};
use lock_zookeeper::{ZkBackend, ZkConfig};
use zookeeper_client::{Acls, Client, CreateMode};

/// The standalone server's variable.
pub(crate) const STANDALONE_VAR: &str = "LOCK_TEST_ZK_ADDR";
/// The 3-node ensemble's variable.
pub(crate) const ENSEMBLE_VAR: &str = "LOCK_TEST_ZK_ENSEMBLE";
/// The connect string in `var`, or the error that says how to get it.
pub(crate) fn hosts(var: &str) -> Result<String, String> {
    env_var(var).map_err(|Failure(why)| why)
}

/// A raw client (a session of its own), or why the server does not answer.
pub(crate) async fn raw_client(hosts: &str, session_timeout: Duration) -> Result<Client, String> {
    let connect = Client::connector()
        .with_session_timeout(session_timeout)
        .with_fail_eagerly()
        .connect(hosts);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(format!("ZooKeeper at `{hosts}` does not answer: {e}")),
        Err(_) => Err(format!(
            "ZooKeeper at `{hosts}` does not answer within 10 s"
        )),
    }
}

fn raw_error(what: &str, path: &str, e: zookeeper_client::Error) -> LockError {
    LockError::backend(format!("test store: {what} `{path}`"), e)
}

/// A ZooKeeper server or ensemble under test: every client is a backend with its own session;
/// an administrator's session of its own removes, lists and plants nodes.
pub(crate) struct ZkStore {
    /// The store URL `config` was parsed from.
    url: String,
    config: ZkConfig,
    /// The administrator's session; replaced by a new one when an outage ended it.
    admin: tokio::sync::Mutex<Client>,
    session_timeout: Duration,
    services: Services,
    /// The service instances an outage stops: the standalone server, or every ensemble node.
    instances: &'static [&'static str],
}

/// The service instances (see `cargo xtask services`) of the servers in `var`.
pub(crate) fn instances(var: &str) -> &'static [&'static str] {
    if var == ENSEMBLE_VAR {
        &["zk-ensemble-1", "zk-ensemble-2", "zk-ensemble-3"]
    } else {
        &["zookeeper"]
    }
}

impl ZkStore {
    /// The store of the servers in `var`, with sessions of `session_timeout`.
    pub(crate) async fn from_env(var: &str, session_timeout: Duration) -> Result<Self, String> {
        let hosts = hosts(var)?;
        let admin = raw_client(&hosts, session_timeout).await?;
        let url = format!(
            "zk://{hosts}?session_timeout_ms={}",
            session_timeout.as_millis()
        );
        let config: ZkConfig = url.parse().map_err(|e: LockError| e.to_string())?;
        let instances = instances(var);
        Ok(Self {
            url,
            config,
            session_timeout: admin.session_timeout(),
            admin: tokio::sync::Mutex::new(admin),
            services: Services::from_env().map_err(|e| e.to_string())?,
            instances,
        })
    }

    /// The administrator's session: a new one if an outage ended the last.
    async fn admin(&self) -> Result<Client, LockError> {
        let mut admin = self.admin.lock().await;
        if admin.state().is_terminated() {
            *admin = raw_client(&self.config.hosts, self.session_timeout)
                .await
                .map_err(|e| LockError::unavailable("test store: admin session", e))?;
        }
        Ok(admin.clone())
    }

    /// A new backend with its own session.
    pub(crate) async fn backend(&self) -> Result<ZkBackend, LockError> {
        ZkBackend::connect(self.config.clone()).await
    }

    /// The children of `name`'s lock node, as the leader has them.
    pub(crate) async fn children(&self, name: &LockName) -> Result<Vec<String>, LockError> {
        let path = self.config.lock_path(name);
        let admin = self.admin().await?;
        match admin.sync(&path).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            Err(e) => return Err(raw_error("sync", &path, e)),
        }
        match admin.list_children(&path).await {
            Ok(mut children) => {
                children.sort();
                Ok(children)
            }
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(raw_error("list", &path, e)),
        }
    }

    /// Creates `name`'s lock node (and the root) if missing, as a container.
    pub(crate) async fn ensure_lock_node(&self, name: &LockName) -> Result<String, LockError> {
        let path = self.config.lock_path(name);
        let root = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let admin = self.admin().await?;
        admin
            .mkdir(&self.config.root, &root)
            .await
            .map_err(|e| raw_error("create", &self.config.root, e))?;
        let container = CreateMode::Container.with_acls(Acls::anyone_all());
        match admin.create(&path, &[], &container).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(path),
            Err(e) => Err(raw_error("create", &path, e)),
        }
    }
}

#[async_trait]
impl TestStore for ZkStore {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.backend().await?))
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn admin(&self) -> Result<Arc<dyn LockAdmin>, LockError> {
        Ok(Arc::new(self.backend().await?))
    }

    /// Deletes every child of the lock node.
    async fn revoke(&self, name: &LockName) -> Result<(), LockError> {
        let path = self.config.lock_path(name);
        let admin = self.admin().await?;
        for child in self.children(name).await? {
            let child = format!("{path}/{child}");
            match admin.delete(&child, None).await {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                Err(e) => return Err(raw_error("delete", &child, e)),
            }
        }
        Ok(())
    }

    /// The children of the lock node. The empty container node itself is not a leftover:
    /// the server deletes it at its next container check.
    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError> {
        let path = self.config.lock_path(name);
        Ok(self
            .children(name)
            .await?
            .into_iter()
            .map(|child| format!("node {path}/{child}"))
            .collect())
    }

    /// A persistent child outside the contender layout.
    async fn plant_foreign(&self, name: &LockName) -> Result<(), LockError> {
        let path = self.ensure_lock_node(name).await?;
        let child = format!("{path}/planted-by-the-conformance-suite");
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        match self
            .admin()
            .await?
            .create(&child, b"not a lock", &persistent)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(raw_error("create", &child, e)),
        }
    }

    fn can_plant_foreign(&self) -> bool {
        true
    }

    /// Stops the standalone server, or every node of the ensemble. Their data stays on disk;
    /// sessions may expire while they are down (the store's own tools open new ones).
    async fn begin_outage(&self) -> Result<(), LockError> {
        self.services.stop(self.instances).await
    }

    async fn end_outage(&self) -> Result<(), LockError> {
        self.services.start_together(self.instances).await
    }

    fn can_fail(&self) -> Result<(), &'static str> {
        Ok(())
    }

    /// The TTL of every lease: the negotiated session timeout less half a server tick.
    fn ttl(&self) -> Duration {
        self.config.lease_ttl(self.session_timeout)
    }

    /// The session timeout: the server deletes a dead holder's node when its session expires.
    fn abandoned_hold_lasts(&self) -> Duration {
        self.session_timeout
    }
}
