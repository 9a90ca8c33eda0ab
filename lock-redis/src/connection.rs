//! [`Conn`]: one auto-reconnecting connection to a single server or to a cluster, behind the
//! client crate's `ConnectionLike` so every operation is written once.

use std::{sync::Arc, time::Duration};

use lock_core::{LockError, backend::redact_url};
use redis::{
    Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
    io::tcp::{TcpSettings, socket2::TcpKeepalive},
};

use crate::error::Error;

#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Conn::Single",
            Self::Cluster(_) => "Conn::Cluster",
        })
    }
}

/// TCP settings of every connection: keepalive probes after 10 s idle, every 5 s, 3 of them,
/// so a connection to a host that died without a reset, or dropped by a NAT or firewall that
/// forgot it, ends within about 25 s even when idle (a pub/sub connection mostly is), and the
/// probes keep NAT mappings alive.
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_keepalive(
        TcpKeepalive::new()
            .with_time(Duration::from_secs(10))
            .with_interval(Duration::from_secs(5))
            .with_retries(3),
    )
}

/// The certificate authorities a `rediss://` connection trusts: the system's, or those of a
/// PEM file ([`RedisConfig::tls_ca_file`](crate::RedisConfig::tls_ca_file)), read once.
#[derive(Clone, Default)]
pub(crate) struct TlsRoots(Option<Arc<Vec<u8>>>);

impl TlsRoots {
    /// Reads `file`, if any.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the file when it cannot be read.
    pub(crate) fn load(file: Option<&std::path::Path>) -> Result<Self, LockError> {
        let Some(file) = file else {
            return Ok(Self(None));
        };
        let pem = std::fs::read(file).map_err(|e| {
            LockError::invalid_options(format!(
                "reading the TLS certificate authorities of `ca_file` {}: {e}",
                file.display()
            ))
        })?;
        Ok(Self(Some(Arc::new(pem))))
    }
}

/// A client of the server at `url` whose connections use [`tcp_settings`] and, over TLS,
/// trust `roots`.
pub(crate) fn client(url: &str, roots: &TlsRoots) -> Result<Client, LockError> {
    let info = url
        .into_connection_info()
        .map_err(|e| invalid_url(url, e))?
        .set_tcp_settings(tcp_settings());
    #[cfg(feature = "tls")]
    if crate::config::is_tls(url) {
        // rustls needs a process-wide crypto provider; another crate may have installed one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if let Some(pem) = &roots.0 {
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            };
            return Client::build_with_tls(info, certificates).map_err(|e| invalid_url(url, e));
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = roots;
    Client::open(info).map_err(|e| invalid_url(url, e))
}

/// The settings of a connection to one server: each request and each connection attempt
/// bounded by `timeout`. A reconnection makes one attempt and then the retries its caller
/// sets (two or one), waiting 10 ms before the first retry and twice as long before the next,
/// each wait with a random jitter of up to as much again (10-20 ms, then 20-40 ms). The first
/// call to meet a broken connection fails at once and starts a reconnection; a call made while
/// one runs waits for the rest of it. With redis-rs's default first wait (100 ms) a one-try
/// acquire took 230-232 ms to fail against a stopped server (over the conformance suite's
/// 250 ms bound once in four runs). Longer outages are retried by the caller, within its wait
/// budget.
fn reconnecting(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(timeout))
        .set_min_delay(Duration::from_millis(10))
}

impl Conn {
    /// Connects to one server; fails when it does not answer.
    pub(crate) async fn single(
        url: &str,
        roots: &TlsRoots,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let client = client(url, roots)?;
        let config = reconnecting(timeout).set_number_of_retries(2);
        let manager = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| Error::new(format!("connecting to {}", redact_url(url)), e))?;
        Ok(Self::Single(manager))
    }

    /// A connection to one server that connects on first use (a Redlock node may be down
    /// when the backend starts); each request bounded by `answer` (Redlock bounds its requests
    /// itself, shorter: this only keeps a request that is never answered from waiting forever).
    pub(crate) fn lazy_single(
        url: &str,
        timeout: Duration,
        answer: Duration,
    ) -> Result<Self, LockError> {
        let client = client(url, &TlsRoots::default())?;
        let config = reconnecting(timeout)
            .set_response_timeout(Some(answer))
            .set_number_of_retries(1);
        let manager = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| Error::new(format!("connecting to {}", redact_url(url)), e))?;
        Ok(Self::Single(manager))
    }

    /// Connects to a cluster through its seed nodes; fails when none answers.
    pub(crate) async fn cluster(urls: &[String], timeout: Duration) -> Result<Self, LockError> {
        let client = cluster_builder(urls, timeout)
            .build()
            .map_err(|e| invalid_url(&urls.join(","), e))?;
        let conn = client.get_async_connection().await.map_err(|e| {
            let seeds: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
            Error::new(
                format!("connecting to the cluster at {}", seeds.join(",")),
                e,
            )
        })?;
        Ok(Self::Cluster(conn))
    }
}

/// A cluster client through the seed nodes `urls`, each network step bounded by `timeout`.
pub(crate) fn cluster_builder(urls: &[String], timeout: Duration) -> ClusterClientBuilder {
    ClusterClientBuilder::new(urls.to_vec())
        .response_timeout(timeout)
        .connection_timeout(timeout)
        .tcp_settings(tcp_settings())
}

fn invalid_url(url: &str, error: redis::RedisError) -> LockError {
    LockError::invalid_options(format!(
        "bad redis URL {:?}: {error}",
        crate::config::redacted(&[url.to_owned()]).join("")
    ))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
