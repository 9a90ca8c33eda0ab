//! Faults specific to MySQL/MariaDB, run one after another (some restart the server):
//!
//! - `KILL CONNECTION` of a holder's connection: row lock: `lost()` fires and a waiter gets the
//!   lock at once; lease: the lock survives until its TTL (and, renewed, beyond);
//! - a row locked by a long foreign transaction (lock-wait timeout 1205) and a renewal batch
//!   chosen as a deadlock victim (1213): classified, retried where safe;
//! - wait budgets below a second on the row-lock strategy: on time, and no statement is left
//!   waiting on the server; a waiting `acquire` dropped mid-wait leaves nothing behind; a
//!   budget that ends while the server does not answer the wait's `KILL QUERY` still answers
//!   Timeout on time;
//! - one client's waiters for a name: only one waits in InnoDB, the others (and their budgets)
//!   in the client; a fence issued by someone else between a grant and its bump is recorded
//!   as the fence the holder really got;
//! - a renewal's `KILL QUERY` of the row-lock hold's parked statement landing between two
//!   statements of its batch (played by a proxy): the hold goes on; the anchor holds park on
//!   killed: the hold goes on, a new anchor comes up, and the hold is still watched;
//! - the lease's waiters' queue: a dead waiter, the holder's own place, places locked behind,
//!   a release of a lease taken without waiting that commits after a waiter parked;
//!   waiters that give up answer on time and wait for no one else's locks; the gate waiters
//!   of other clients wait on, and its holder stopped or dropped;
//! - an unreachable server and a refused login: typed errors;
//! - a server restart while locks are held and waited for: typed errors, then recovery with
//!   no manual clean-up;
//! - the client clock: every statement the library sends is captured on the wire, and none
//!   carries a time computed by the client: expiry is `NOW(6) + INTERVAL <ttl>` on the server;
//!   and clients run under `faketime` 10 minutes behind and ahead never get a lock another
//!   holds, while a killed holder's lease still ends after its TTL by the server's clock.
//!
//! Needs `LOCK_TEST_MYSQL_URL`, `LOCK_TEST_SERVICES_DIR` and `LOCK_TEST_FAKETIME` (`cargo
//! xtask test` sets them; `cargo xtask services up` installs `faketime`);
//! without them every case fails. Arguments filter cases by substring.
//!
//! This file holds the `main` and what the cases share; each topic has a file of its own, and
//! the MySQL wire format is in `tests/support/wire.rs`.

#[path = "../support/mod.rs"]
mod support;

mod clock;
mod connections;
mod foreign_transactions;
mod lease_gate;
mod lease_leaving;
mod lease_lone_release;
mod lease_long_parks;
mod lease_parks;
mod lease_queue;
mod restart;
mod row_lock_fences;
mod row_lock_park;
mod row_lock_waits;
mod sent_times;
mod skewed;

use std::{process::ExitCode, time::Duration};

use conformance_tests::{Cases, Failure, Outcome, faults::err, holder_process};
use lock_core::{LockClient, LockError, LockGuard, LockName, LockOptions};
use lock_mysql::{MySqlBackend, MySqlConfig};
use sqlx::{AssertSqlSafe, MySqlConnection};
use support::{MySqlStore, hex};

fn main() -> ExitCode {
    if let Some(role) = holder_process::role() {
        if role == lease_gate::ROLE {
            return lease_gate::child();
        }
        return skewed::child(&role);
    }
    let cases = Cases::<Failure>::new("faults").limit(Duration::from_secs(120));
    lease_gate::cases(lease_leaving::cases(lease_queue::cases(
        lease_long_parks::cases(lease_parks::cases(lease_lone_release::cases(cases))),
    )))
    .case("row_lock/kill_holder_connection", || {
        Box::pin(connections::row_lock_kill_holder())
    })
    .case("row_lock/sessions_per_client", || {
        Box::pin(connections::row_lock_sessions_per_client())
    })
    .case("lease/sessions_per_client", || {
        Box::pin(connections::lease_sessions_per_client())
    })
    .case("lease/kill_holder_connection", || {
        Box::pin(connections::lease_kill_holder())
    })
    .case("lease/row_locked_by_long_transaction", || {
        Box::pin(foreign_transactions::lease_lock_wait_timeout())
    })
    .case("lease/renewal_batch_deadlock_is_retried", || {
        Box::pin(foreign_transactions::lease_deadlock_retried())
    })
    .case("lease/a_stopped_release_leaves_no_open_transaction", || {
        Box::pin(foreign_transactions::a_stopped_release_leaves_no_open_transaction())
    })
    .case("row_lock/sub_second_budgets", || {
        Box::pin(row_lock_waits::row_lock_sub_second_budgets())
    })
    .case("row_lock/dropped_waiter_leaves_nothing", || {
        Box::pin(row_lock_waits::row_lock_dropped_waiter())
    })
    .case("row_lock/budget_ends_before_the_kill_answers", || {
        Box::pin(row_lock_waits::row_lock_budget_ends_before_the_kill_answers())
    })
    .case("row_lock/one_waiter_per_name_per_client", || {
        Box::pin(row_lock_waits::row_lock_one_waiter_per_client())
    })
    .case("row_lock/park_killed_between_statements", || {
        Box::pin(row_lock_park::killed_between_statements())
    })
    .case("row_lock/park_anchor_killed", || {
        Box::pin(row_lock_park::anchor_killed())
    })
    .case("row_lock/anchor_killed_while_idle", || {
        Box::pin(row_lock_park::anchor_killed_while_idle())
    })
    .case("row_lock/anchor_outlives_a_late_bump", || {
        Box::pin(row_lock_park::anchor_outlives_a_late_bump())
    })
    .case("row_lock/fence_bumped_between_grant_and_bump", || {
        Box::pin(row_lock_fences::row_lock_fence_bumped_in_between())
    })
    .case("row_lock/fence_counter_at_maximum_is_foreign", || {
        Box::pin(row_lock_fences::row_lock_fence_at_maximum())
    })
    .case("errors/unreachable_and_refused", || {
        Box::pin(connections::unreachable_and_refused())
    })
    .case("restart/held_and_waited_locks", || {
        Box::pin(restart::restart_with_locks())
    })
    .case("clock/client_sends_no_time", || {
        Box::pin(clock::client_sends_no_time())
    })
    .case("clock/skewed_clients_never_double_grant", || {
        Box::pin(skewed::never_double_grant())
    })
    .case("clock/source_never_reads_the_wall_clock", || {
        Box::pin(clock::source_never_reads_wall_clock())
    })
    .finally(support::drop_tables_after_cases)
    .main()
}

/// A waiter: `client` acquires `name` for a new holder in the background.
fn spawn_acquire(
    client: &LockClient,
    name: &LockName,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { client.lock_with(&name, &options).await })
}

/// The lock a [`spawn_acquire`] got, or why it got none.
async fn acquired(
    waiter: tokio::task::JoinHandle<Result<LockGuard, LockError>>,
) -> Result<LockGuard, Failure> {
    waiter
        .await
        .map_err(err)?
        .map_err(|e| Failure(format!("the waiter failed: {e}")))
}

/// A child role's lease client and lock: the lock named by the variable `name_var`, on the
/// lease table named by `table_var` (a child of this binary, see `holder_process::child`).
async fn child_client(name_var: &str, table_var: &str) -> Result<(LockClient, LockName), String> {
    let name = std::env::var(name_var).map_err(|e| format!("{name_var}: {e}"))?;
    let table = std::env::var(table_var).map_err(|e| format!("{table_var}: {e}"))?;
    let config = MySqlConfig::new(support::url()?)
        .strategy(lock_mysql::Strategy::Lease)
        .table(lock_mysql::TableName::new(table).map_err(|e| e.to_string())?);
    let backend = MySqlBackend::connect(&config)
        .await
        .map_err(|e| e.to_string())?;
    let name = LockName::new(name).map_err(|e| e.to_string())?;
    Ok((LockClient::new(backend), name))
}

async fn client(config: &MySqlConfig) -> Result<LockClient, Failure> {
    Ok(LockClient::new(
        MySqlBackend::connect(config).await.map_err(err)?,
    ))
}

async fn admin_conn() -> Result<MySqlConnection, Failure> {
    support::admin_conn().await.map_err(Failure)
}

async fn kill_connection(id: u64) -> Outcome {
    let mut admin = admin_conn().await?;
    sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
        .execute(&mut admin)
        .await
        .map_err(|e| Failure(format!("KILL CONNECTION {id}: {e}")))?;
    Ok(())
}

/// How many places (live or not) the queue of `store` holds for `name`.
pub(crate) async fn places(store: &MySqlStore, name: &LockName) -> Result<i64, Failure> {
    let queue = format!("`{}_queue`", store.config().table_name().as_str());
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {queue} WHERE name = X'{}'",
        hex(name.as_str())
    )))
    .fetch_one(store.admin())
    .await
    .map_err(|e| Failure(format!("counting places: {e}")))
}

/// Waits until a statement mentioning `name` is waiting on `store`'s server.
async fn until_waiting(store: &MySqlStore, name: &LockName) -> Outcome {
    support::until_waiting(store.admin(), name)
        .await
        .map_err(Failure)
}

/// The lock went from `held` to `next`: `next`'s fence is above `held`'s. Releases `next`
/// and drops `held`.
pub(crate) async fn handed_on(held: LockGuard, next: LockGuard) -> Outcome {
    conformance_tests::ensure!(
        next.fence() > held.fence(),
        "fence {} after {}",
        next.fence(),
        held.fence()
    );
    next.release().await.map_err(err)?;
    drop(held);
    Ok(())
}

/// Waits up to a second for no statement on `name` to run on `store`'s server.
async fn until_no_statement(store: &MySqlStore, name: &LockName) -> Outcome {
    support::until_no_statement(store.admin(), name)
        .await
        .map_err(Failure)
}
