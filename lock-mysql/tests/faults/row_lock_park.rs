//! The statement a row-lock hold keeps parked on its connection: a `KILL QUERY` that stops it
//! for a renewal must never leave the connection waiting for an answer.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, unique_name},
};
use lock_core::LockOptions;
use lock_mysql::{MySqlConfig, Strategy};

use super::{
    client,
    support::{
        self, MySqlStore,
        proxy::{Proxy, upstream},
    },
};

/// A renewal stops the hold's parked statement with `KILL QUERY`, just as the sleep ends by
/// itself when the watchdog renews on time (a 1.5 s TTL parks ~0.5 s and renews after
/// ~0.5 s). A kill landing between two statements of a batch makes MariaDB end the batch
/// without the rest of its answer, though its last answer said more would follow; the
/// client then waited for it until the server's idle limit (1 s in a lease's last second)
/// closed the connection, and the live holder lost its lock ("the session holding the lock
/// ended"; seen in CI). The proxy here plays that answer on every park; the hold must come
/// through two TTLs of renewals, an extension and the release.
pub(super) async fn killed_between_statements() -> Outcome {
    let url = support::url().map_err(Failure)?;
    let proxy = Proxy::cutting_parks(upstream(&url).map_err(Failure)?)
        .await
        .map_err(Failure)?;
    MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?; // creates this run's table
    let config = support::config(Strategy::RowLock).map_err(Failure)?;
    let mut proxied = MySqlConfig::new(proxy.url(&url).map_err(Failure)?)
        .strategy(Strategy::RowLock)
        .pool_size(2);
    proxied.table = config.table.clone();
    let holder = client(&proxied).await?;
    let name = unique_name("park-cut")?;
    let ttl = Duration::from_millis(1500);
    let held = holder
        .lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .map_err(err)?;
    let lost = tokio::time::timeout(ttl * 2, held.lost()).await;
    ensure!(
        lost.is_err(),
        "a live, renewing holder lost its lock: {:?}",
        lost.ok()
    );
    held.extend(ttl).await.map_err(err)?;
    ensure!(held.is_held(), "the hold ended after its extension");
    held.release().await.map_err(err)?;
    Ok(())
}
