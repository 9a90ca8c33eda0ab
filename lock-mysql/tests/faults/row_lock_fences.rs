//! Row lock fences: one issued by someone else between a grant and its bump, and a counter
//! with no fence left.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_until, unique_name},
};
use lock_core::{LockError, LockOptions};
use lock_mysql::Strategy;
use sqlx::AssertSqlSafe;

use super::{
    admin_conn, client, spawn_acquire,
    support::{self, MySqlStore, hex},
};

/// Row lock: a fence issued by someone else after a grant read the counter and before its own
/// bump (here, an administrator's bump committed while the holder's waits for its row) makes
/// the bump issue a larger fence than the one the grant recorded; the record is corrected, so
/// the guard and `inspect` show the fence the holder really got. While the bump waits,
/// `inspect` shows no holder: the recorded fence is not issued yet.
pub(super) async fn row_lock_fence_bumped_in_between() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let a = client(store.config()).await?;
    let name = unique_name("fence-between")?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(10));
    // Creates the lock row and the counter row (fence 1).
    let first = a.lock_with(&name, &options).await.map_err(err)?;
    let first_fence = first.fence().get();
    first.release().await.map_err(err)?;
    let fences = format!("`{}_fences`", store.config().table_name().as_str());
    let mut admin = admin_conn().await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "START TRANSACTION; UPDATE {fences} SET fence = fence + 1 WHERE name = X'{}'",
        hex(name.as_str())
    )))
    .execute(&mut admin)
    .await
    .map_err(err)?;
    let acquiring = spawn_acquire(&a, &name, options.clone());
    // The grant has read the committed counter once its bump (the only statement naming this
    // run's fence table besides the probe) runs, waiting for the counter row.
    poll_until(
        Duration::from_secs(2),
        "the holder's bump waiting for the counter row",
        async || {
            let waiting = support::statements_mentioning(store.admin(), &fences)
                .await
                .map_err(Failure)?;
            ensure!(
                waiting > 0 || !acquiring.is_finished(),
                "the holder's bump never waited for the counter row"
            );
            Ok(waiting > 0)
        },
    )
    .await?;
    // The grant's record is written, but its fence is not issued yet: not a hold yet.
    let early = a.backend().inspect(&name).await.map_err(err)?;
    ensure!(
        early.is_none(),
        "inspect shows {early:?} while the holder's fence bump has not committed"
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let guard = acquiring
        .await
        .map_err(err)?
        .map_err(|e| Failure(format!("the acquire failed: {e}")))?;
    let fence = guard.fence().get();
    ensure!(
        fence == first_fence + 2,
        "fence {fence} after {first_fence} and the administrator's bump"
    );
    let info = a
        .backend()
        .inspect(&name)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("inspect shows no holder".into()))?;
    ensure!(
        info.fence.get() == fence,
        "inspect shows fence {}, the guard has {fence}",
        info.fence
    );
    guard.release().await.map_err(err)?;
    Ok(())
}

/// Row lock: a fence counter at its maximum (no fence left to issue) is a `Foreign` row, not
/// a server error: the acquire changes nothing, and the lock is free for the next try.
pub(super) async fn row_lock_fence_at_maximum() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let a = client(store.config()).await?;
    let name = unique_name("fence-max")?;
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let first = a.lock_with(&name, &options).await.map_err(err)?;
    first.release().await.map_err(err)?;
    let fences = format!("`{}_fences`", store.config().table_name().as_str());
    let mut admin = admin_conn().await?;
    let set = |fence: &str| {
        format!(
            "UPDATE {fences} SET fence = {fence} WHERE name = X'{}'",
            hex(name.as_str())
        )
    };
    sqlx::raw_sql(AssertSqlSafe(set("18446744073709551615")))
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let refused = a.lock_with(&name, &options).await;
    ensure!(
        matches!(&refused, Err(LockError::Foreign { found, .. }) if found.contains("maximum")),
        "acquire with the fence counter at its maximum: {refused:?}, expected Foreign"
    );
    sqlx::raw_sql(AssertSqlSafe(set("7")))
        .execute(&mut admin)
        .await
        .map_err(err)?;
    let next = a.lock_with(&name, &options).await.map_err(err)?;
    ensure!(
        next.fence().get() == 8,
        "fence {} after the counter was set to 7",
        next.fence()
    );
    next.release().await.map_err(err)?;
    Ok(())
}
