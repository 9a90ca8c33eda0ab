//! Server settings that change what a hold or a fence is worth, and a server that is down:
//!
//! - MariaDB's `idle_write_transaction_timeout` would end a row-lock hold (an idle write
//!   transaction) before its local deadline: the hold's connection turns it off;
//! - a per-user `MAX_STATEMENT_TIME` (MariaDB) would cut a row-lock wait short with error 1969:
//!   the wait's connection turns it off, and the wait keeps its budget;
//! - `innodb_flush_log_at_trx_commit` other than 1 (a crash can lose the last fence bumps)
//!   makes both strategies declare best-effort fencing;
//! - with the server stopped, one `acquire` of either strategy answers a retryable
//!   `Unavailable` within its wait budget.
//!
//! Global variables are set for milliseconds (around the connect they concern) and restored by
//! a guard; other runs share the server. Needs `LOCK_TEST_MYSQL_URL` and
//! `LOCK_TEST_SERVICES_DIR` (root logs in over the server's socket).

mod support;

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use conformance_tests::{Cases, Failure, Outcome, ensure};
use lock_core::{
    Fencing, LockBackend, LockClient, LockError, LockName, LockOptions, backend::AcquireRequest,
};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy};
use support::{
    MySqlStore,
    admin::{GlobalSetting, TempUser},
};

fn main() -> ExitCode {
    Cases::<Failure>::new("server")
        .limit(Duration::from_secs(120))
        .case("row_lock/idle_write_transaction_timeout_is_off", || {
            Box::pin(idle_write_transaction_timeout_is_off())
        })
        .case(
            "row_lock/statement_time_limit_does_not_cut_the_wait",
            || Box::pin(statement_time_limit_does_not_cut_the_wait()),
        )
        .case("fencing/follows_commit_durability", || {
            Box::pin(fencing_follows_commit_durability())
        })
        .case("outage/acquire_is_unavailable_within_budget", || {
            Box::pin(outage_acquire_within_budget())
        })
        .finally(support::drop_tables_after_cases)
        .main()
}

fn name(tag: &str) -> Result<LockName, Failure> {
    Ok(LockName::new(format!(
        "server/{tag}/{:016x}",
        rand::random::<u64>()
    ))?)
}

async fn client(config: &MySqlConfig) -> Result<LockClient, Failure> {
    Ok(LockClient::new(MySqlBackend::connect(config).await?))
}

/// A row-lock hold (TTL 30 s) made while `idle_write_transaction_timeout = 1` is the global
/// default: 2 s later it is still held, and nobody else gets the lock.
async fn idle_write_transaction_timeout_is_off() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = name("idle-write")?;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    // The hold's connection is opened by this acquire and takes the global value then.
    let setting = GlobalSetting::set("idle_write_transaction_timeout", "1").map_err(Failure)?;
    let held = a.lock_with(&name, &options).await;
    setting.restore().map_err(Failure)?;
    let held = held?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let other = b.try_lock_with(&name, &options).await?;
    ensure!(
        !(held.is_held() && other.is_some()),
        "two holders: the first still says is_held() while another client got the lock \
         (the server ended the idle hold after 1 s)"
    );
    ensure!(
        held.is_held() && other.is_none(),
        "the hold ended after 2 s of a 30 s TTL (is_held: {}, other got it: {})",
        held.is_held(),
        other.is_some()
    );
    held.release().await?;
    Ok(())
}

/// A waiter whose user has `MAX_STATEMENT_TIME 0.5` waits out its 2 s budget and answers
/// `Timeout`, not a server error after 0.5 s.
async fn statement_time_limit_does_not_cut_the_wait() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let base =
        url::Url::parse(&support::url().map_err(Failure)?).map_err(|e| Failure(e.to_string()))?;
    let database = base.path().trim_start_matches('/').to_owned();
    let user = TempUser::create(&database, "MAX_STATEMENT_TIME 0.5").map_err(Failure)?;
    let mut limited = base.clone();
    limited
        .set_username(&user.name)
        .and_then(|()| limited.set_password(Some(&user.password)))
        .map_err(|()| Failure("cannot set the user".into()))?;
    let mut config = store.config().clone();
    config.url = limited.into();
    let a = client(store.config()).await?;
    let b = client(&config).await?;
    let name = name("statement-time")?;
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let held = a.lock_with(&name, &options).await?;
    let budget = Duration::from_secs(2);
    let start = Instant::now();
    let waited = b.lock_with(&name, &options.clone().wait(budget)).await;
    let took = start.elapsed();
    ensure!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "a waiter under MAX_STATEMENT_TIME 0.5 got {waited:?} after {took:?}, expected Timeout"
    );
    ensure!(
        took >= budget.mul_f64(0.9),
        "the waiter gave up after {took:?} of its {budget:?} budget"
    );
    held.release().await?;
    Ok(())
}

/// Both strategies declare strict fencing on a durable server and best-effort fencing when
/// `innodb_flush_log_at_trx_commit = 2` (set only while the backend connects).
async fn fencing_follows_commit_durability() -> Outcome {
    for strategy in [Strategy::Lease, Strategy::RowLock] {
        let store = MySqlStore::new(strategy).await.map_err(Failure)?;
        let durable = MySqlBackend::connect(store.config()).await?;
        ensure!(
            durable.capabilities().fencing == Fencing::Strict,
            "{strategy}: {:?} on a server with innodb_flush_log_at_trx_commit = 1",
            durable.capabilities().fencing
        );
        let setting = GlobalSetting::set("innodb_flush_log_at_trx_commit", "2").map_err(Failure)?;
        let lax = MySqlBackend::connect(store.config()).await;
        setting.restore().map_err(Failure)?;
        let fencing = lax?.capabilities().fencing;
        ensure!(
            fencing == Fencing::BestEffort,
            "{strategy}: {fencing:?} on a server with innodb_flush_log_at_trx_commit = 2"
        );
    }
    Ok(())
}

/// Starts the server again when dropped (synchronously), whatever happened meanwhile.
struct Restart(PathBuf);

impl Drop for Restart {
    fn drop(&mut self) {
        let _ = std::process::Command::new("sh")
            .arg(&self.0)
            .stdin(std::process::Stdio::null())
            .status();
    }
}

fn service_script(which: &str) -> Result<PathBuf, Failure> {
    let dir = std::env::var_os("LOCK_TEST_SERVICES_DIR").ok_or_else(|| {
        Failure("LOCK_TEST_SERVICES_DIR is not set; run `cargo xtask test`".into())
    })?;
    let path = PathBuf::from(dir).join("mariadb").join(which);
    ensure!(path.exists(), "{} does not exist", path.display());
    Ok(path)
}

/// With the server stopped, one `acquire` (3 s budget) of each strategy answers a retryable
/// `Unavailable` within the budget (the outage lasts a few seconds: others share the server).
async fn outage_acquire_within_budget() -> Outcome {
    let (stop, start) = (service_script("stop")?, service_script("start")?);
    let mut backends = Vec::new();
    for strategy in [Strategy::Lease, Strategy::RowLock] {
        let store = MySqlStore::new(strategy).await.map_err(Failure)?;
        // The library's default connect timeout (5 s), longer than the budget.
        let config = store
            .config()
            .clone()
            .connect_timeout(Duration::from_secs(5));
        backends.push((strategy, MySqlBackend::connect(&config).await?));
    }
    let budget = Duration::from_secs(3);
    let options = LockOptions::new().ttl(Duration::from_secs(5)).wait(budget);
    let restart = Restart(start);
    let status = std::process::Command::new("sh")
        .arg(&stop)
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| Failure(format!("stopping the server: {e}")))?;
    ensure!(status.success(), "stopping the server: {status}");
    // Pooled connections idle this long are pinged before use: the pool then opens new ones.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let outage = async {
        let tries = backends.iter().map(|(strategy, backend)| {
            let options = options.clone();
            async move {
                let request = AcquireRequest::new(name("outage")?, &options)?;
                let began = Instant::now();
                let result = backend.acquire(&request).await;
                Ok::<_, Failure>((*strategy, result, began.elapsed()))
            }
        });
        futures::future::join_all(tries)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, Failure>>()
    }
    .await;
    drop(restart);
    for (strategy, result, took) in outage? {
        ensure!(
            matches!(&result, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
            "{strategy}: an acquire with the server down gave {result:?}, expected Unavailable"
        );
        ensure!(
            took <= budget + Duration::from_millis(300),
            "{strategy}: the acquire with a {budget:?} budget answered after {took:?}"
        );
    }
    Ok(())
}
