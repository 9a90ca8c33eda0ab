//! Every scheme connects to the `cargo xtask services` servers, declares what `declared()`
//! says it does, and locks; `require=` refuses a weaker store and accepts a strong one.
//!
//! Needs the `LOCK_TEST_*` variables `cargo xtask test` sets; without them every case fails.

mod support;

use support::hosts;

use std::{process::ExitCode, time::Duration};

use conformance_tests::{Cases, Failure, Outcome, ensure, faults::env_var};
use distributed_lock::{LockError, StoreConfig, declared};

fn main() -> ExitCode {
    Cases::<Failure>::new("stores")
        .limit(Duration::from_secs(60))
        .case("memory", || Box::pin(memory()))
        .case("redis", || Box::pin(redis()))
        .case("rediss", || Box::pin(rediss()))
        .case("redis+cluster", || Box::pin(redis_cluster()))
        .case("redlock", || Box::pin(redlock()))
        .case("mysql_and_mariadb", || Box::pin(mysql()))
        .case("zk_and_zookeeper", || Box::pin(zookeeper()))
        .case("require_refuses_a_weaker_store", || {
            Box::pin(require_refuses())
        })
        .main()
}

fn failure(e: LockError) -> Failure {
    Failure(e.to_string())
}

/// Connects to `url`, checks the capabilities against the table under `label`, and takes and
/// releases a lock.
async fn connects(url: &str, label: &str) -> Outcome {
    let config: StoreConfig = url.parse().map_err(failure)?;
    ensure!(
        config.store.label() == label,
        "{url} is {}, not {label}",
        config.store.label()
    );
    let backend = config.backend().await.map_err(failure)?;
    let declared = declared()
        .into_iter()
        .find(|(store, _)| *store == label)
        .map(|(_, capabilities)| capabilities)
        .ok_or_else(|| Failure(format!("{label} is not in declared()")))?;
    ensure!(
        backend.capabilities() == declared,
        "{label} declares {:?}; the table says {declared:?}",
        backend.capabilities()
    );
    let locks = distributed_lock::LockClient::new(backend.clone());
    let name = format!("facade/{label}/{:016x}", rand::random::<u64>());
    let guard = locks
        .lock_with(
            name.as_str(),
            &distributed_lock::LockOptions::new().ttl(Duration::from_secs(5)),
        )
        .await
        .map_err(failure)?;
    ensure!(guard.is_held(), "{label}: the lock is not held");
    guard.release().await.map_err(failure)?;
    Ok(())
}

async fn memory() -> Outcome {
    connects("memory://stores-test", "memory").await?;
    // Two clients of one instance share it.
    let (a, b) = (
        distributed_lock::connect("memory://shared")
            .await
            .map_err(failure)?,
        distributed_lock::connect("memory://shared")
            .await
            .map_err(failure)?,
    );
    let held = a
        .try_lock("one")
        .await
        .map_err(failure)?
        .ok_or_else(|| Failure("memory://shared: the first try failed".into()))?;
    let second = b.try_lock("one").await.map_err(failure)?;
    ensure!(
        second.is_none(),
        "a second client of memory://shared got a lock the first holds"
    );
    held.release().await.map_err(failure)
}

async fn redis() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    connects(&format!("{url}?prefix=facade"), "redis").await
}

/// `rediss://`: TLS to the services' Redis, trusting the authority that signed its
/// certificate; without that authority (the system's only) the server is refused, and an
/// unreadable `ca_file` is a typed error naming it.
async fn rediss() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_TLS_URL")?;
    connects(&format!("{url}&prefix=facade-tls"), "redis").await?;
    let (plain, _) = url
        .split_once('?')
        .ok_or_else(|| Failure(format!("{url} has no ca_file")))?;
    let untrusted = distributed_lock::connect(plain).await;
    ensure!(
        matches!(&untrusted, Err(e) if e.to_string().contains("UnknownIssuer")),
        "{plain}: expected the server's certificate refused (UnknownIssuer), got {:?}",
        untrusted.map(|_| "a client")
    );
    let missing = distributed_lock::connect(&format!("{plain}?ca_file=/nonexistent/ca.pem")).await;
    match missing {
        Err(LockError::InvalidOptions { reason }) if reason.contains("/nonexistent/ca.pem") => {
            Ok(())
        }
        other => Err(Failure(format!(
            "an unreadable ca_file: expected InvalidOptions naming it, got {:?}",
            other.map(|_| "a client")
        ))),
    }
}

async fn redis_cluster() -> Outcome {
    let urls = env_var("LOCK_TEST_REDIS_CLUSTER_URLS")?;
    connects(
        &format!("redis+cluster://{}", hosts(&urls)),
        "redis+cluster",
    )
    .await
}

async fn redlock() -> Outcome {
    let urls = env_var("LOCK_TEST_REDLOCK_URLS")?;
    connects(
        &format!("redlock://{}?node_timeout_ms=100", hosts(&urls)),
        "redlock",
    )
    .await
}

async fn mysql() -> Outcome {
    let url = env_var("LOCK_TEST_MYSQL_URL")?;
    connects(&format!("{url}?table=facade_leases"), "mysql (lease)").await?;
    let maria = url.replacen("mysql://", "mariadb://", 1);
    connects(
        &format!("{maria}?strategy=row-lock&table=facade_row_locks"),
        "mysql (row-lock)",
    )
    .await
}

async fn zookeeper() -> Outcome {
    let one = env_var("LOCK_TEST_ZK_ADDR")?;
    connects(&format!("zk://{one}/facade"), "zookeeper (one server)").await?;
    let ensemble = env_var("LOCK_TEST_ZK_ENSEMBLE")?;
    connects(
        &format!("zookeeper://{ensemble}/facade?session_timeout_ms=4000"),
        "zookeeper (ensemble)",
    )
    .await
}

async fn require_refuses() -> Outcome {
    let urls = env_var("LOCK_TEST_REDLOCK_URLS")?;
    let refused = distributed_lock::connect(&format!(
        "redlock://{}?require=quorum,strict-fencing",
        hosts(&urls)
    ))
    .await;
    let Err(error) = refused else {
        return Err(Failure("Redlock was accepted as strict-fencing".into()));
    };
    ensure!(
        matches!(error, LockError::InvalidOptions { .. })
            && error
                .to_string()
                .contains("`strict-fencing` (declared by: memory, redis,")
            && !error.to_string().contains("`quorum`"),
        "the refusal: {error}"
    );
    let ensemble = env_var("LOCK_TEST_ZK_ENSEMBLE")?;
    distributed_lock::connect(&format!(
        "zk://{ensemble}/facade?require=quorum,strict-fencing,server-clock,push,fifo"
    ))
    .await
    .map_err(failure)?;
    Ok(())
}
