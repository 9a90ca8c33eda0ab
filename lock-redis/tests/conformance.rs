//! The conformance suite against a single Redis, Redlock over five servers, and Redis Cluster.

use std::{sync::Arc, time::Duration};

use conformance_tests::{Runner, Services, TestStore};
use lock_core::{LockAdmin, LockClient, LockError, LockName, backend::async_trait};
use lock_redis::{RedisBackend, RedisConfig, RedisKeys, RedlockBackend, RedlockConfig};
use redis::{AsyncCommands, aio::MultiplexedConnection, cluster_async::ClusterConnection};

/// Stable across processes, so the killed-holder child locks the same keys.
const PREFIX: &str = "conformance";

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set; run `cargo xtask test`"))
}

fn urls(name: &str) -> Result<Vec<String>, String> {
    Ok(var(name)?.split(',').map(str::to_owned).collect())
}

/// Raw access to the servers, for the fault tools.
enum Raw {
    Servers(Vec<MultiplexedConnection>),
    Cluster(ClusterConnection),
}

enum Kind {
    Single(RedisConfig),
    Cluster(RedisConfig),
    Redlock(RedlockConfig),
}

struct RedisStore {
    /// The store URL the backend's config was parsed from.
    url: String,
    kind: Kind,
    raw: Raw,
    services: Services,
}

fn redis_err(e: redis::RedisError) -> LockError {
    LockError::unavailable("test tool", e)
}

impl RedisStore {
    async fn servers(urls: &[String]) -> Result<Raw, String> {
        let mut conns = Vec::new();
        for url in urls {
            let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("{url} does not answer: {e}"))?;
            conns.push(conn);
        }
        Ok(Raw::Servers(conns))
    }

    /// `scheme://host:port,...` of `redis://` server URLs, with this suite's key prefix.
    fn store_url(scheme: &str, urls: &[String]) -> String {
        let hosts: Vec<&str> = urls
            .iter()
            .map(|u| u.trim_start_matches("redis://"))
            .collect();
        format!("{scheme}://{}?prefix={PREFIX}", hosts.join(","))
    }

    async fn single() -> Result<Self, String> {
        let url = var("LOCK_TEST_REDIS_URL")?;
        let store_url = Self::store_url("redis", std::slice::from_ref(&url));
        let config: RedisConfig = store_url.parse().map_err(|e: LockError| e.to_string())?;
        RedisBackend::connect(config.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            raw: Self::servers(&[url]).await?,
            url: store_url,
            kind: Kind::Single(config),
            services: Services::from_env().map_err(|e| e.to_string())?,
        })
    }

    async fn cluster() -> Result<Self, String> {
        let urls = urls("LOCK_TEST_REDIS_CLUSTER_URLS")?;
        let store_url = Self::store_url("redis+cluster", &urls);
        let config: RedisConfig = store_url.parse().map_err(|e: LockError| e.to_string())?;
        RedisBackend::connect(config.clone())
            .await
            .map_err(|e| e.to_string())?;
        let client = redis::cluster::ClusterClient::new(urls).map_err(|e| e.to_string())?;
        let raw = client
            .get_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            raw: Raw::Cluster(raw),
            url: store_url,
            kind: Kind::Cluster(config),
            services: Services::from_env().map_err(|e| e.to_string())?,
        })
    }

    async fn redlock() -> Result<Self, String> {
        let urls = urls("LOCK_TEST_REDLOCK_URLS")?;
        let store_url = Self::store_url("redlock", &urls);
        let config: RedlockConfig = store_url.parse().map_err(|e: LockError| e.to_string())?;
        Ok(Self {
            raw: Self::servers(&urls).await?,
            url: store_url,
            kind: Kind::Redlock(config),
            services: Services::from_env().map_err(|e| e.to_string())?,
        })
    }

    /// The service instances an outage stops: the server, a majority of the Redlock servers,
    /// or every cluster node.
    fn outage_instances(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Single(_) => &["redis"],
            Kind::Redlock(_) => &["redlock-0", "redlock-1", "redlock-2"],
            Kind::Cluster(_) => &["redis-cluster"],
        }
    }

    /// Waits until every cluster node reports `cluster_state:ok` again (up to 30 s).
    async fn cluster_ok() -> Result<(), LockError> {
        let urls = urls("LOCK_TEST_REDIS_CLUSTER_URLS").map_err(LockError::unavailable_msg)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        for url in urls {
            loop {
                let client = redis::Client::open(url.as_str()).map_err(redis_err)?;
                let info: Option<String> = match client.get_multiplexed_async_connection().await {
                    Ok(mut conn) => redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query_async(&mut conn)
                        .await
                        .ok(),
                    Err(_) => None,
                };
                if info.is_some_and(|info| info.contains("cluster_state:ok")) {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(LockError::unavailable_msg(format!(
                        "cluster node {url} not ok 30 s after its restart"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    fn keys(name: &LockName) -> RedisKeys {
        RedisKeys::new(PREFIX, name)
    }

    /// Runs `cmd` on every server (Redlock) or on the one server or cluster.
    async fn each(&self, cmd: &redis::Cmd) -> Result<Vec<redis::Value>, LockError> {
        let mut out = Vec::new();
        match &self.raw {
            Raw::Servers(conns) => {
                for conn in conns {
                    out.push(
                        cmd.query_async(&mut conn.clone())
                            .await
                            .map_err(redis_err)?,
                    );
                }
            }
            Raw::Cluster(conn) => out.push(
                cmd.query_async(&mut conn.clone())
                    .await
                    .map_err(redis_err)?,
            ),
        }
        Ok(out)
    }
}

#[async_trait]
impl TestStore for RedisStore {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(match &self.kind {
            Kind::Single(config) | Kind::Cluster(config) => {
                LockClient::new(RedisBackend::connect(config.clone()).await?)
            }
            Kind::Redlock(config) => {
                LockClient::new(RedlockBackend::connect(config.clone()).await?)
            }
        })
    }

    fn url(&self) -> String {
        lock_core::backend::redact_url(&self.url)
    }

    async fn admin(&self) -> Result<Arc<dyn LockAdmin>, LockError> {
        Ok(match &self.kind {
            Kind::Single(config) | Kind::Cluster(config) => {
                Arc::new(RedisBackend::connect(config.clone()).await?)
            }
            Kind::Redlock(config) => Arc::new(RedlockBackend::connect(config.clone()).await?),
        })
    }

    async fn revoke(&self, name: &LockName) -> Result<(), LockError> {
        self.each(redis::cmd("DEL").arg(Self::keys(name).lock))
            .await?;
        Ok(())
    }

    async fn leftovers(&self, name: &LockName) -> Result<Vec<String>, LockError> {
        let keys = Self::keys(name);
        let mut left = Vec::new();
        // Everything but the fence counter, which must stay.
        for key in [keys.lock, keys.waiters, keys.queue, keys.places] {
            let found = self.each(redis::cmd("EXISTS").arg(&key)).await?;
            left.extend(
                found
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v == redis::Value::Int(1))
                    .map(|(i, _)| format!("key `{key}` on server {i}")),
            );
        }
        Ok(left)
    }

    async fn plant_foreign(&self, name: &LockName) -> Result<(), LockError> {
        let key = Self::keys(name).lock;
        match &self.raw {
            Raw::Servers(conns) => {
                for conn in conns {
                    let _: () = conn
                        .clone()
                        .set(&key, "written-by-someone-else")
                        .await
                        .map_err(redis_err)?;
                }
            }
            Raw::Cluster(conn) => {
                let _: () = conn
                    .clone()
                    .set(&key, "written-by-someone-else")
                    .await
                    .map_err(redis_err)?;
            }
        }
        Ok(())
    }

    fn can_plant_foreign(&self) -> bool {
        true
    }

    /// Stops the servers (without persistence they come back empty).
    async fn begin_outage(&self) -> Result<(), LockError> {
        self.services.stop(self.outage_instances()).await
    }

    async fn end_outage(&self) -> Result<(), LockError> {
        self.services.start(self.outage_instances()).await?;
        if let Kind::Cluster(_) = self.kind {
            Self::cluster_ok().await?;
        }
        Ok(())
    }

    fn can_fail(&self) -> Result<(), &'static str> {
        Ok(())
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }
}

fn main() -> std::process::ExitCode {
    Runner::new()
        .store("redis", RedisStore::single)
        .store("redlock(5)", RedisStore::redlock)
        .store("redis-cluster", RedisStore::cluster)
        .main()
}
