//! The client clock: the library sends no time of its own, and its source never reads the
//! wall clock.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, unique_name},
};
use lock_core::LockOptions;
use lock_mysql::{MySqlConfig, Strategy};

use super::{
    client,
    sent_times::{client_time_in, client_time_in_parameters, now_windows},
    spawn_acquire,
    support::{
        self, MySqlStore,
        proxy::{Proxy, Recording, upstream},
    },
};

/// Both strategies through a proxy that records what the client sends: acquisitions,
/// contention, renewals, extension, release and inspection. No statement carries a time the
/// client computed; every expiry is `NOW(6) + INTERVAL <ttl>` evaluated by the server, and
/// every expiry comparison is against the server's `NOW(6)`. So a client whose clock is
/// minutes off sends exactly the same statements as one whose clock is right, and cannot
/// cause a double grant. (This proves it from the traffic; `skewed_clients_never_double_grant`
/// runs clients whose clock is minutes off.)
pub(super) async fn client_sends_no_time() -> Outcome {
    let url = support::url().map_err(Failure)?;
    let recording = Recording::default();
    let proxy = Proxy::recording(upstream(&url).map_err(Failure)?, &recording)
        .await
        .map_err(Failure)?;
    let proxied = proxy.url(&url).map_err(Failure)?;
    let ttls = [Duration::from_millis(1500), Duration::from_secs(4)];
    let ttls_us: Vec<u64> = ttls.iter().map(|t| t.as_micros() as u64).collect();
    let mut acquisitions = 0;
    for strategy in [Strategy::Lease, Strategy::RowLock] {
        acquisitions += every_operation(&proxied, strategy, ttls).await?;
    }
    let (statements, executes) = recording.commands();
    let granting = statements
        .iter()
        .filter(|s| s.contains("INTERVAL") || s.contains("FOR UPDATE"))
        .count();
    ensure!(
        granting >= 2 && executes.len() >= acquisitions,
        "captured {} statements ({granting} granting) and {} executions: the proxy saw too little",
        statements.len(),
        executes.len()
    );
    for sql in &statements {
        if let Some(why) = client_time_in(sql, &ttls_us) {
            return Err(Failure(format!(
                "the client sent a time of its own ({why}): {sql:.300}"
            )));
        }
    }
    for payload in &executes {
        if let Some(why) = client_time_in_parameters(payload) {
            return Err(Failure(format!(
                "the client bound a time of its own ({why})"
            )));
        }
    }
    // The parameters are really seen: the TTLs travel as bound microseconds.
    let bound_ttl = ttls_us.iter().any(|us| {
        let le = us.to_le_bytes();
        executes.iter().any(|p| p.windows(8).any(|w| w == le))
    });
    ensure!(
        bound_ttl,
        "no bound TTL seen in {} executions",
        executes.len()
    );
    checker_catches_client_times(&ttls_us)
}

/// Two clients of `strategy`, connected to `proxied_url`, acquire (one waiting), renew
/// (the watchdog), extend, inspect and release, with the TTLs `ttls`; how many acquisitions.
async fn every_operation(
    proxied_url: &str,
    strategy: Strategy,
    ttls: [Duration; 2],
) -> Result<usize, Failure> {
    MySqlStore::new(strategy).await.map_err(Failure)?; // creates this run's table directly
    let config = support::config(strategy).map_err(Failure)?;
    let mut proxied = MySqlConfig::new(proxied_url)
        .strategy(strategy)
        .pool_size(2);
    proxied.table = config.table.clone();
    let (a, b) = (client(&proxied).await?, client(&proxied).await?);
    let name = unique_name("clock")?;
    let options = LockOptions::new().ttl(ttls[0]);
    let held = a.lock_with(&name, &options).await.map_err(err)?;
    let waiter = spawn_acquire(&b, &name, options.clone().wait(Duration::from_secs(5)));
    tokio::time::sleep(ttls[0]).await; // the watchdog renews meanwhile
    held.extend(ttls[1]).await.map_err(err)?;
    b.inspect(&name).await.map_err(err)?;
    held.release().await.map_err(err)?;
    let next = waiter.await.map_err(err)?.map_err(err)?;
    next.release().await.map_err(err)?;
    Ok(2)
}

/// The checker itself catches a client-computed expiry, in a statement's text as in its
/// bound values.
fn checker_catches_client_times(ttls_us: &[u64]) -> Outcome {
    let bad = "UPDATE t SET expires_at = '2026-11-21 10:00:00.000000' WHERE name = X'61'";
    ensure!(
        client_time_in(bad, ttls_us).is_some(),
        "the checker misses a date literal"
    );
    let epoch = format!(
        "UPDATE t SET expires_at = FROM_UNIXTIME({})",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    );
    ensure!(
        client_time_in(&epoch, ttls_us).is_some(),
        "the checker misses an epoch time"
    );
    let shifted = "UPDATE t SET expires_at = NOW(6) + INTERVAL 999 MICROSECOND";
    ensure!(
        client_time_in(shifted, ttls_us).is_some(),
        "the checker misses a foreign interval"
    );
    let bound_if = "UPDATE t SET expires_at = IF(token = ?, ?, expires_at) WHERE name = ?";
    ensure!(
        client_time_in(bound_if, ttls_us).is_some(),
        "the checker misses a bound expiry inside IF()"
    );
    let mut bound = vec![0u8; 9];
    bound.extend_from_slice(&(now_windows()[2].0 as u64).to_le_bytes());
    ensure!(
        client_time_in_parameters(&bound).is_some(),
        "the checker misses a bound epoch in microseconds"
    );
    Ok(())
}

/// The library's source never reads the wall clock: times come from the server, and the
/// client keeps only monotonic instants for its own deadlines.
pub(super) async fn source_never_reads_wall_clock() -> Outcome {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).map_err(err)? {
        let path = entry.map_err(err)?.path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(err)?;
        read += 1;
        for clock in [
            "SystemTime::now",
            "Utc::now",
            "Local::now",
            "OffsetDateTime::now",
            "chrono::",
        ] {
            ensure!(!text.contains(clock), "{} uses {clock}", path.display());
        }
    }
    ensure!(
        read >= 5,
        "read only {read} source files in {}",
        dir.display()
    );
    Ok(())
}
