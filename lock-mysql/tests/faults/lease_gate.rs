//! The lease's gate (`lock_mysql`'s `lease/gate.rs`): waiters of other clients wait for it in
//! `GET_LOCK`, in the order they came, rather than in the waiters' queue, where only the
//! gate's holder has a place; a holder that is paused or dropped gives it back in bounded
//! time.

use std::{
    io::Write as _,
    process::ExitCode,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{Paused, err, poll_every, unique_name},
    holder_process,
};
use lock_core::{LockClient, LockError, LockGuard, LockName, LockOptions};
use lock_mysql::Strategy;
use sqlx::AssertSqlSafe;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    task::JoinHandle,
};

use super::{
    client,
    lease_queue::ForeignLocks,
    places, spawn_acquire,
    support::{MySqlStore, hex},
};

/// The role of a child of this binary that waits for a lock (see [`child`]).
pub(super) const ROLE: &str = "lease-gate-waiter";
/// The lock the child waits for.
const NAME_VAR: &str = "LOCK_TEST_GATE_NAME";
/// The lease table the child uses.
const TABLE_VAR: &str = "LOCK_TEST_GATE_TABLE";

/// The gate cases, added to `cases`.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("lease/waiters_of_other_clients_wait_at_the_gate", || {
            Box::pin(lease_waiters_wait_at_the_gate())
        })
        .case("lease/arrivals_at_a_locked_row_wait_at_the_gate", || {
            Box::pin(lease_arrivals_at_a_locked_row())
        })
        .case("lease/a_paused_gate_holder_stalls_the_lock_briefly", || {
            Box::pin(lease_paused_gate_holder())
        })
        .case("lease/a_dropped_gate_holder_gives_the_gate_back", || {
            Box::pin(lease_dropped_gate_holder())
        })
        .case(
            "lease/a_waiter_dropped_at_the_gate_leaves_no_gate_behind",
            || Box::pin(lease_waiter_dropped_at_the_gate()),
        )
}

/// How many sessions of `store`'s server run a statement on `name` (one that carries the
/// name's bytes) of which `condition` holds (`what` names them in an error).
async fn sessions(
    store: &MySqlStore,
    name: &LockName,
    (condition, what): (&str, &str),
) -> Result<i64, Failure> {
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE {condition} \
         AND LOCATE('{}', INFO) > 0",
        hex(name.as_str())
    )))
    .fetch_one(store.admin())
    .await
    .map_err(|e| Failure(format!("counting {what}: {e}")))
}

/// How many sessions wait for the gate of `name` on `store`'s server.
async fn at_the_gate(store: &MySqlStore, name: &LockName) -> Result<i64, Failure> {
    let waiting = "STATE = 'User lock' AND LOCATE('lock-mysql/gate/', INFO) > 0";
    sessions(store, name, (waiting, "the gate's waiters")).await
}

/// Waits up to `limit` until `count` sessions wait for the gate of `name`.
async fn until_at_the_gate(
    store: &MySqlStore,
    name: &LockName,
    count: i64,
    limit: Duration,
) -> Outcome {
    poll_every(
        Duration::from_millis(5),
        limit,
        &format!("{count} waiter(s) waiting for the gate"),
        async || Ok(at_the_gate(store, name).await? == count),
    )
    .await
}

/// Waits until `count` waiters of `name` parked (their parks wrote their connections into
/// their places), 5 s at most.
async fn until_parked(store: &MySqlStore, name: &LockName, count: i64) -> Outcome {
    until_parked_within(store, name, count, Duration::from_secs(5)).await
}

/// [`until_parked`], `limit` at most.
async fn until_parked_within(
    store: &MySqlStore,
    name: &LockName,
    count: i64,
    limit: Duration,
) -> Outcome {
    let queue = format!("`{}_queue`", store.config().table_name().as_str());
    let sql = format!(
        "SELECT COUNT(*) FROM {queue} WHERE name = X'{}' AND connection_id IS NOT NULL",
        hex(name.as_str())
    );
    poll_every(
        Duration::from_millis(5),
        limit,
        &format!("{count} waiter(s) parking"),
        async || {
            let parked: i64 = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                .fetch_one(store.admin())
                .await
                .map_err(err)?;
            Ok(parked == count)
        },
    )
    .await
}

/// Waiters of separate clients on one held lease: the first takes the gate and a place in the
/// queue, the others wait for the gate in `GET_LOCK`, not in the queue (a thousand of them
/// arriving together each wrote a place and refreshed it, and the server granted almost
/// nothing for seconds). Each waiter comes once the one before waits; when the lease is
/// released they get it in that order. (Before the gate, every waiter wrote a place: the
/// second never waited for the gate.)
async fn lease_waiters_wait_at_the_gate() -> Outcome {
    const WAITERS: usize = 6;
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let holder = client(store.config()).await?;
    let name = unique_name("gate-order")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for index in 0..WAITERS {
        let waiter = client(store.config()).await?;
        let (wanted, options, order) = (name.clone(), long.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = waiter
                .lock_with(&wanted, &options.wait(Duration::from_secs(20)))
                .await?;
            order
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(index);
            guard.release().await
        }));
        if index == 0 {
            until_parked(&store, &name, 1).await?;
        } else {
            let count = i64::try_from(index).map_err(err)?;
            until_at_the_gate(&store, &name, count, Duration::from_secs(5)).await?;
        }
    }
    let queued = places(&store, &name).await?;
    held.release().await.map_err(err)?;
    for waiter in waiters {
        waiter.await.map_err(err)?.map_err(err)?;
    }
    let order = order.lock().unwrap_or_else(PoisonError::into_inner).clone();
    ensure!(
        queued == 1,
        "{queued} places in the queue with {WAITERS} waiters: only the gate's holder queues there"
    );
    ensure!(
        order == (0..WAITERS).collect::<Vec<_>>(),
        "the waiters got the lease in the order {order:?}, not the order they came in"
    );
    Ok(())
}

/// How many acquire tries on `name` run on `store`'s server (tries of a budget under the
/// pool's lock-wait limit, which carry the name: see [`lease_arrivals_at_a_locked_row`]).
async fn at_the_row(store: &MySqlStore, name: &LockName) -> Result<i64, Failure> {
    let trying = "COMMAND = 'Query' AND LOCATE('INSERT INTO', INFO) > 0";
    sessions(store, name, (trying, "the row's waiters")).await
}

/// Waiters of separate clients arriving while the lease row is locked (a foreign transaction
/// here; a thousand first tries at once, each locking the row in turn, in the 1,000-client
/// benchmark, where InnoDB then took seconds to get through them): a call's first try does not
/// wait for the row's lock, so only the gate's holder waits for the row (its try after the
/// gate), the others for the gate. (Before, every arriving waiter's first try waited for the
/// row: four row waiters here, none at the gate.) Once the row is free, all get the lease.
/// (Budgets of 4 s, under the pool's lock-wait limit of 5 s: the tries then carry their
/// values, the lock's name among them, in their text, where the server's process list shows
/// it.) MariaDB only, as this suite: on MySQL first tries wait for the row.
async fn lease_arrivals_at_a_locked_row() -> Outcome {
    const WAITERS: usize = 4;
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let holder = client(store.config()).await?;
    let name = unique_name("gate-locked-row")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let foreign = ForeignLocks::lease_row(&store, &name).await?;
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let waiter = client(store.config()).await?;
        waiters.push(spawn_acquire(
            &waiter,
            &name,
            long.clone().wait(Duration::from_secs(4)),
        ));
    }
    let mut seen = (0, 0);
    let settled = poll_every(
        Duration::from_millis(5),
        Duration::from_secs(5),
        "one waiter at the row and the others at the gate",
        async || {
            seen = (
                at_the_row(&store, &name).await?,
                at_the_gate(&store, &name).await?,
            );
            Ok(seen == (1, i64::try_from(WAITERS - 1).map_err(err)?))
        },
    )
    .await;
    foreign.rollback().await?;
    held.release().await.map_err(err)?;
    settled.map_err(|Failure(e)| {
        Failure(format!(
            "{e}: last seen {} at the row, {} at the gate",
            seen.0, seen.1
        ))
    })?;
    for waiter in waiters {
        waiter
            .await
            .map_err(err)?
            .map_err(err)?
            .release()
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// The gate's holder is a process that is then stopped (SIGSTOP), with its connections open:
/// the waiter after it, waiting for the gate, gets the lease a few seconds after the release
/// that hands the lease to the stopped process (the server ends the stopped holder's idle
/// gate connection after its idle limit, 2 s with the default back-off; the lease handed to
/// it meanwhile lasts its turn, 1.1 s, and its place 2 s after its last park). Without the
/// idle limit the gate stayed the stopped process's and the waiter waited out its budget.
/// Once continued, the stopped process gets the lease in turn, without its gate.
async fn lease_paused_gate_holder() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (holder, waiter) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("gate-paused")?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let mut child = holder_process::child(ROLE)
        .map_err(Failure)?
        .env(NAME_VAR, name.as_str())
        .env(TABLE_VAR, store.config().table_name().as_str())
        .spawn()
        .map_err(|e| Failure(format!("starting the waiting process: {e}")))?;
    let mut lines = BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| Failure("the waiting process has no stdout".into()))?,
    )
    .lines();
    until_parked(&store, &name, 1).await?;
    let pid = child
        .id()
        .ok_or_else(|| Failure("the waiting process has no id".into()))?;
    let paused = Paused::process(pid)?;
    let waiting = spawn_acquire(&waiter, &name, long.clone().wait(Duration::from_secs(20)));
    until_at_the_gate(&store, &name, 1, Duration::from_secs(5)).await?;
    let released = Instant::now();
    held.release().await.map_err(err)?;
    let outcome = waiting.await.map_err(err)?;
    let stalled = released.elapsed();
    paused.resume()?;
    let guard = outcome.map_err(|e| {
        Failure(format!(
            "the waiter behind the stopped gate holder got {e} after {stalled:?}"
        ))
    })?;
    // The idle limit (2 s), then the next waiter's queue batch and try.
    let bound = Duration::from_millis(3_500);
    ensure!(
        stalled <= bound,
        "the waiter behind a stopped gate holder got the lease {stalled:?} after the release (bound {bound:?})"
    );
    guard.release().await.map_err(err)?;
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .map_err(|_| Failure("the continued process did not get the lease within 10 s".into()))?
        .map_err(err)?;
    ensure!(
        line.as_deref().is_some_and(|line| line.starts_with("GOT ")),
        "the continued process answered {line:?}, expected GOT <fence>"
    );
    Ok(())
}

/// A lease of `name` held by `holder` (30 s), a waiter of `gated` that took the gate and
/// parked, and one of `waiting` waiting for the gate (budgets 20 s).
struct AtTheGate {
    held: LockGuard,
    gated: JoinHandle<Result<LockGuard, LockError>>,
    waiting: JoinHandle<Result<LockGuard, LockError>>,
}

impl AtTheGate {
    async fn set_up(
        store: &MySqlStore,
        name: &LockName,
        [holder, gated, waiting]: [&LockClient; 3],
    ) -> Result<Self, Failure> {
        let long = LockOptions::new().ttl(Duration::from_secs(30));
        let held = holder.lock_with(name, &long).await.map_err(err)?;
        let budget = long.wait(Duration::from_secs(20));
        let gated = spawn_acquire(gated, name, budget.clone());
        until_parked(store, name, 1).await?;
        let waiting = spawn_acquire(waiting, name, budget);
        until_at_the_gate(store, name, 1, Duration::from_secs(5)).await?;
        Ok(Self {
            held,
            gated,
            waiting,
        })
    }
}

/// Drops the `acquire` call of `task` (aborts it), and checks that it was.
async fn drop_call(task: JoinHandle<Result<LockGuard, LockError>>, what: &str) -> Outcome {
    task.abort();
    let aborted = task.await;
    ensure!(
        aborted
            .as_ref()
            .is_err_and(tokio::task::JoinError::is_cancelled),
        "{what} was not dropped: {aborted:?}"
    );
    Ok(())
}

/// An `acquire` holding the gate is dropped (its task aborted): the gate's connection is
/// closed, which gives the gate back at once, and the next waiter takes it well before the
/// connection's idle limit (2 s) would have.
async fn lease_dropped_gate_holder() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let holder = client(store.config()).await?;
    let (dropped, waiter) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("gate-dropped")?;
    let scene = AtTheGate::set_up(&store, &name, [&holder, &dropped, &waiter]).await?;
    drop_call(scene.gated, "the gate's holder").await?;
    until_at_the_gate(&store, &name, 0, Duration::from_secs(1)).await?;
    scene.held.release().await.map_err(err)?;
    let guard = scene.waiting.await.map_err(err)?.map_err(err)?;
    guard.release().await.map_err(err)?;
    Ok(())
}

/// An `acquire` dropped while it waits for the gate (in `GET_LOCK`, behind the gate's holder):
/// its connection is closed, so its wait ends with it. The gate's holder is then granted and
/// released, and a new waiter takes the gate and parks at once. (Before, the dropped call's
/// connection went back to its pool with the wait still running on the server, which took
/// the gate once the holder gave it back and kept it until the server ended that idle
/// connection, 2 s later, or as long as the client kept using it.)
async fn lease_waiter_dropped_at_the_gate() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (holder, gated) = (client(store.config()).await?, client(store.config()).await?);
    let (dropped, next) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("gate-dropped-waiter")?;
    let scene = AtTheGate::set_up(&store, &name, [&holder, &gated, &dropped]).await?;
    drop_call(scene.waiting, "the waiter at the gate").await?;
    scene.held.release().await.map_err(err)?;
    let first = scene.gated.await.map_err(err)?.map_err(err)?;
    first.release().await.map_err(err)?;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock_with(&name, &long).await.map_err(err)?;
    let last = spawn_acquire(&next, &name, long.clone().wait(Duration::from_secs(5)));
    let parked = until_parked_within(&store, &name, 1, Duration::from_secs(1)).await;
    held.release().await.map_err(err)?;
    last.await
        .map_err(err)?
        .map_err(err)?
        .release()
        .await
        .map_err(err)?;
    parked.map_err(|Failure(e)| {
        Failure(format!(
            "{e}: the gate was still taken after its holder's grant"
        ))
    })
}

/// The child's part: waits for the lock (30 s), prints `GOT <fence>`, releases it.
pub(super) fn child() -> ExitCode {
    let result = conformance_tests::runtime().and_then(|runtime| {
        runtime.block_on(async {
            let (client, name) = super::child_client(NAME_VAR, TABLE_VAR).await?;
            let options = LockOptions::new()
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(30));
            let guard = client
                .lock_with(&name, &options)
                .await
                .map_err(|e| e.to_string())?;
            let mut out = std::io::stdout();
            writeln!(out, "GOT {}", guard.fence()).map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
            guard.release().await.map_err(|e| e.to_string())
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gate waiter: {e}");
            ExitCode::FAILURE
        }
    }
}
