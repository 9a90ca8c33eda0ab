//! Connections that end or never start: a holder's connection killed (row lock: the hold
//! ends with it; lease: it does not), an unreachable server, a refused login.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_every, unique_name},
};
use lock_core::{LockClient, LockError, LockGuard, LockName, LockOptions, LossReason};
use lock_mysql::{MySqlBackend, MySqlConfig, Strategy};

use super::{
    acquired, client, handed_on, kill_connection, spawn_acquire,
    support::{
        self, MySqlStore,
        admin::{TempUser, root_sql},
        hex,
    },
    until_waiting,
};

/// Row lock: killing the holder's connection rolls its transaction back: the waiter queued in
/// InnoDB gets the lock at once, with a larger fence, and the holder's `lost()` fires.
pub(super) async fn row_lock_kill_holder() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (a, b) = (client(store.config()).await?, client(store.config()).await?);
    let name = unique_name("kill-row")?;
    let ttl = Duration::from_secs(2);
    let options = LockOptions::new().ttl(ttl).wait(Duration::ZERO);
    let held = a.lock_with(&name, &options).await.map_err(err)?;
    let waiter = spawn_acquire(&b, &name, options.clone().wait(Duration::from_secs(20)));
    until_waiting(&store, &name).await?;
    let id = store
        .holder_connection(&name)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("the holder recorded no connection id".into()))?;
    kill_connection(id).await?;
    let killed = Instant::now();
    let next = acquired(waiter).await?;
    let handed = killed.elapsed();
    ensure!(
        handed <= Duration::from_millis(500),
        "the waiter got the lock {handed:?} after the holder's connection was killed"
    );
    ensure!(
        next.fence() > held.fence(),
        "fence {} after {}",
        next.fence(),
        held.fence()
    );
    let reason = tokio::time::timeout(ttl, held.lost())
        .await
        .map_err(|_| Failure(format!("lost() did not fire within {ttl:?} of the kill")))?;
    ensure!(reason == LossReason::SessionEnded, "lost() said {reason:?}");
    ensure!(!held.is_held(), "is_held() after the connection was killed");
    let late = held.release().await;
    ensure!(
        matches!(late, Err(LockError::Lost { .. })),
        "release after the kill: {late:?}"
    );
    next.release().await.map_err(err)?;
    Ok(())
}

/// A user of its own for a client (see [`TempUser`]), and `config` logging in as that user.
fn own_user(mut config: MySqlConfig) -> Result<(TempUser, MySqlConfig), Failure> {
    let base = url::Url::parse(&support::url().map_err(Failure)?).map_err(err)?;
    let database = base.path().trim_start_matches('/').to_owned();
    let user = TempUser::create(&database, "MAX_QUERIES_PER_HOUR 0").map_err(Failure)?;
    let mut own = base.clone();
    own.set_username(&user.name)
        .and_then(|()| own.set_password(Some(&user.password)))
        .map_err(|()| Failure("cannot set the user".into()))?;
    config.url = own.into();
    Ok((user, config))
}

/// How many sessions `user` has open on the server.
fn sessions_of(user: &TempUser) -> Result<u64, Failure> {
    let sessions = root_sql(&format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '{}'",
        user.name
    ))
    .map_err(Failure)?;
    sessions
        .parse()
        .map_err(|e| Failure(format!("{sessions:?} sessions: {e}")))
}

/// Checks that `user` has at least `fewest` and at most `most` sessions open on the server:
/// `who`, a client, needs `fewest` (a count that finds fewer counts something else).
fn sessions_between(user: &TempUser, (fewest, most): (u64, u64), who: &str) -> Outcome {
    let sessions = sessions_of(user)?;
    ensure!(
        sessions <= most,
        "{who} has {sessions} sessions (at most {most} expected)"
    );
    ensure!(
        sessions >= fewest,
        "{sessions} sessions counted for {who}, who needs {fewest}"
    );
    Ok(())
}

/// Row lock: a client's sessions on the server are one per hold or wait it has (or idle, kept
/// for its next hold), and one more: its anchor, which its holds park on and which runs its
/// fence bumps and the kills of its parked statements. A client holding one lock and waiting
/// for another has three (it had 5 or 6 when the bump and the kill ran on the connection kept
/// beside the pool, and the schema check left pooled connections behind); after its wait is
/// granted and its first hold released, still three (the released hold's connection kept for
/// the next), and its holds still park on the anchor they parked on first: lending its
/// connection to the bumps and the kill did not end it. The client logs in as a user of its
/// own, so that its sessions can be counted. (On MySQL, which has no anchor, the kept
/// connection is the third.)
pub(super) async fn row_lock_sessions_per_client() -> Outcome {
    let store = MySqlStore::new(Strategy::RowLock).await.map_err(Failure)?;
    let (user, config) = own_user(store.config().clone())?;
    let a = client(&config).await?;
    let b = client(store.config()).await?;
    let (held_name, waited_name) = (
        unique_name("sessions-held")?,
        unique_name("sessions-waited")?,
    );
    // No watchdog: no renewal's kill meets a bump on the anchor (it would open the kept one).
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .watchdog(false);
    let other = b.lock_with(&waited_name, &options).await.map_err(err)?;
    let held = a.lock_with(&held_name, &options).await.map_err(err)?;
    let first_anchor = parked_anchor_of(&user, Duration::from_secs(2)).await?;
    let waiter = spawn_acquire(
        &a,
        &waited_name,
        options.clone().wait(Duration::from_secs(20)),
    );
    // The waiter's statement, seen as `root` (the store's user sees only its own sessions).
    let waiting = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '{}' AND INFO LIKE '%{}%'",
        user.name,
        hex(waited_name.as_str())
    );
    poll_every(
        Duration::from_millis(5),
        Duration::from_secs(2),
        "the wait",
        async || Ok(root_sql(&waiting).map_err(Failure)? != "0"),
    )
    .await?;
    // Its hold and its wait at least.
    let who = "a row-lock client holding one lock and waiting for another";
    sessions_between(&user, (2, 3), who)?;
    other.release().await.map_err(err)?;
    let granted = acquired(waiter).await?;
    held.release().await.map_err(err)?;
    let who = "a row-lock client holding one lock after a wait and a release";
    sessions_between(&user, (1, 3), who)?;
    let anchor = parked_anchor_of(&user, Duration::from_secs(2)).await?;
    ensure!(
        anchor == first_anchor,
        "the client's holds parked on {first_anchor}, and after its bumps and kills on {anchor}"
    );
    granted.release().await.map_err(err)?;
    Ok(())
}

/// Lease: a waiting client's sessions on the server are its pool's (a pool of 2 here, as in
/// the benchmark's runs of separate clients: the park's connection and one for the queue's
/// batches) and its anchor, which its parks wait on and which runs its tries and lone releases
/// (the connection kept beside the pool became the anchor). So 3 while it waits, and still 3
/// after it was granted, released and took and released another lock alone; its next park
/// waits on the anchor its first did. The client logs in as a user of its own, so that its
/// sessions can be counted.
pub(super) async fn lease_sessions_per_client() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (user, config) = own_user(store.config().clone())?;
    let a = client(&config.pool_size(2)).await?;
    let b = client(store.config()).await?;
    let (waited_name, alone_name) = (
        unique_name("lease-sessions-waited")?,
        unique_name("lease-sessions-alone")?,
    );
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .watchdog(false);
    let waiting = options.clone().wait(Duration::from_secs(20));
    let other = b.lock_with(&waited_name, &options).await.map_err(err)?;
    // Its first try opens a connection before it parks (and raises its anchor then).
    let waiter = spawn_acquire(&a, &waited_name, waiting.clone());
    let first_anchor = parked_anchor_of(&user, Duration::from_secs(5)).await?;
    // Its park and its anchor at least.
    sessions_between(&user, (2, 3), "a lease client waiting for a lock")?;
    other.release().await.map_err(err)?;
    let granted = acquired(waiter).await?;
    granted.release().await.map_err(err)?;
    let alone = a.lock_with(&alone_name, &options).await.map_err(err)?;
    alone.release().await.map_err(err)?;
    // Its anchor at least.
    let who = "a lease client that waited, then took a lock alone";
    sessions_between(&user, (1, 3), who)?;
    let other = b.lock_with(&waited_name, &options).await.map_err(err)?;
    let waiter = spawn_acquire(&a, &waited_name, waiting);
    let anchor = parked_anchor_of(&user, Duration::from_secs(5)).await?;
    ensure!(
        anchor == first_anchor,
        "the client's first park waited on {first_anchor}, after its tries and releases on {anchor}"
    );
    other.release().await.map_err(err)?;
    let granted = acquired(waiter).await?;
    granted.release().await.map_err(err)?;
    Ok(())
}

/// The anchor a parked statement of `user` waits on (`GET_LOCK('lock-mysql/park/...')`, seen
/// as `root`); waits for one up to `within`.
async fn parked_anchor_of(user: &TempUser, within: Duration) -> Result<String, Failure> {
    const MARK: &str = "GET_LOCK('lock-mysql/park/";
    let parked = format!(
        "SELECT INFO FROM information_schema.PROCESSLIST WHERE USER = '{}' \
         AND INFO LIKE '%lock-mysql/park/%'",
        user.name
    );
    let mut found = None;
    poll_every(
        Duration::from_millis(5),
        within,
        "a parked statement",
        async || {
            let infos = root_sql(&parked).map_err(Failure)?;
            found = infos.lines().find_map(|info| {
                let start = info.find(MARK)? + MARK.len();
                let end = start + info[start..].find('\'')?;
                Some(format!("lock-mysql/park/{}", &info[start..end]))
            });
            Ok(found.is_some())
        },
    )
    .await?;
    found.ok_or_else(|| Failure("no parked statement".into()))
}

/// Kills every session of `user` (as `root`, with MariaDB's `KILL USER`); fails when it has
/// none.
fn kill_sessions_of(user: &TempUser) -> Outcome {
    let who = format!("'{}'@'127.0.0.1'", user.name);
    let sessions = root_sql(&format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '{}'",
        user.name
    ))
    .map_err(Failure)?;
    ensure!(
        sessions.parse::<u64>().is_ok_and(|n| n > 0),
        "user {who} has no session to kill ({sessions:?})"
    );
    root_sql(&format!("KILL USER {who}")).map_err(Failure)?;
    Ok(())
}

/// Lease: the hold does not live in a connection. Killed, its holder's connections take
/// nothing with it: the lease lasts until its TTL (watchdog off) or for as long as the
/// watchdog renews it through a new connection. The holder logs in as a user of its own, so
/// that every session of its client (the pool's, the one kept beside it, the anchor's) is
/// killed, whichever ran the acquisition.
///
/// The renewed lease has a TTL of 3 s, and other clients' tries are sent again while the store
/// answers `Unavailable` (see [`try_answered`]): every renewal and try commits, and a disk that
/// stalls the server's log flush must not decide a case about killed connections. With a TTL
/// of 1 s, CI once saw the hold lost 2 s after the kill, and under a local disk load a try
/// answered `Unavailable` after 0.5 s.
pub(super) async fn lease_kill_holder() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (user, single) = own_user(store.config().clone().pool_size(1))?;
    let backend = MySqlBackend::connect(&single).await.map_err(err)?;
    let a = LockClient::new(backend.clone());
    let b = client(store.config()).await?;
    let ttl = Duration::from_secs(2);

    let name1 = unique_name("kill-lease")?;
    let start = Instant::now();
    let held = a
        .lock_with(&name1, &LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .map_err(err)?;
    kill_sessions_of(&user)?;
    // Tries sent again until half the TTL after the acquisition, well before the lease ends.
    let busy = try_answered(&b, &name1, ttl, start + ttl / 2).await?;
    ensure!(
        busy.is_none(),
        "the lease ended with its holder's connection"
    );
    let info = b.inspect(&name1).await.map_err(err)?;
    ensure!(
        info.is_some_and(|i| i.token == *held.lease().token()),
        "inspect does not show the holder after the kill"
    );
    let next = b
        .lock_with(&name1, &LockOptions::new().ttl(ttl).wait(ttl * 3))
        .await
        .map_err(err)?;
    let took = start.elapsed();
    ensure!(
        took >= ttl.mul_f64(0.95),
        "the lease ended after {took:?}, before its {ttl:?} TTL"
    );
    ensure!(
        took <= ttl + Duration::from_millis(800),
        "the lease ended only after {took:?}"
    );
    handed_on(held, next).await?;

    let name2 = unique_name("kill-lease-renewed")?;
    let ttl = Duration::from_secs(3);
    let renewed = a
        .lock_with(&name2, &LockOptions::new().ttl(ttl))
        .await
        .map_err(err)?;
    kill_sessions_of(&user)?;
    let killed = Instant::now();
    // Unrenewed since the kill, the row would have ended within `ttl` of it (its expiry was
    // last written before the kill, by the acquisition or a renewal); the hold is watched
    // past that instant, then another client tries it.
    let past_the_row = ttl + Duration::from_millis(500);
    if let Ok(reason) = tokio::time::timeout(past_the_row, renewed.lost()).await {
        return Err(Failure(format!(
            "lost {:?} after its connections were killed: {reason}",
            killed.elapsed()
        )));
    }
    ensure!(
        renewed.is_held(),
        "is_held() is false {past_the_row:?} after the kill, though lost() did not fire"
    );
    let busy = try_answered(&b, &name2, ttl, Instant::now() + ttl / 2).await?;
    ensure!(
        busy.is_none(),
        "another client got a lease the watchdog kept renewing"
    );
    // A busy answer alone could come from a try abandoned during a stall that took the free
    // lease on the server: the store must show the renewed lease.
    let info = b.inspect(&name2).await.map_err(err)?;
    ensure!(
        info.is_some_and(|i| i.token == *renewed.lease().token()),
        "inspect does not show the renewed lease {past_the_row:?} after the kill"
    );
    renewed.release().await.map_err(err)?;
    Ok(())
}

/// `client`'s try for `name`, sent again while the store answers `Unavailable` (a statement
/// that waited past its bound, as one does while the disk stalls the server's commits), until
/// `until`: such an answer does not say whether the lock was free (the server may even have
/// run the abandoned try), which the case asks. The last answer once `until` has passed.
async fn try_answered(
    client: &LockClient,
    name: &LockName,
    ttl: Duration,
    until: Instant,
) -> Result<Option<LockGuard>, Failure> {
    loop {
        match client
            .try_lock_with(name, &LockOptions::new().ttl(ttl))
            .await
        {
            Err(LockError::Unavailable { .. }) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answer => return answer.map_err(err),
        }
    }
}

/// A server nobody listens on is `Unavailable` (retryable) within the connect timeout; a
/// refused login is a `Backend` error (retrying will not help).
pub(super) async fn unreachable_and_refused() -> Outcome {
    // A port just bound and released: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(err)?
        .port();
    let timeout = Duration::from_secs(1);
    let down = MySqlConfig::new(format!("mysql://lock:x@127.0.0.1:{port}/locktest"))
        .connect_timeout(timeout);
    let start = Instant::now();
    let result = MySqlBackend::connect(&down).await;
    let took = start.elapsed();
    ensure!(
        matches!(&result, Err(e @ LockError::Unavailable { .. }) if e.is_retryable()),
        "an unreachable server gave {result:?}"
    );
    ensure!(
        took <= timeout + Duration::from_millis(500),
        "took {took:?}"
    );
    let mut url = url::Url::parse(&support::url().map_err(Failure)?).map_err(err)?;
    url.set_password(Some("wrong-password"))
        .map_err(|()| Failure("cannot set a password".into()))?;
    let refused =
        MySqlBackend::connect(&MySqlConfig::new(url.as_str()).connect_timeout(timeout)).await;
    ensure!(
        matches!(&refused, Err(LockError::Backend { .. })),
        "a refused login gave {refused:?}"
    );
    let shown = refused.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(
        !shown.contains("wrong-password"),
        "the error shows the password: {shown}"
    );
    Ok(())
}
