//! The 3-node ensemble: its leader killed under a holder, a follower cut off from the
//! quorum, and the half tick a leader may learn late that a follower's session was touched.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_until, unique_name},
};
use futures::FutureExt;
use lock_core::{Fence, LockClient, LockGuard, LockName, LockOptions, Lost};
use lock_zookeeper::{ZkBackend, ZkConfig};
use tokio::task::JoinSet;

use super::{
    client, locked,
    servers::{Server, follower_of, leader_of},
    support::{ENSEMBLE_VAR, ZkStore, hosts},
    take_record_release,
};

/// The waiters of `leader_killed`, and the fences they got, in the order they got them.
struct Waiters {
    tasks: JoinSet<Outcome>,
    fences: Arc<Mutex<Vec<Fence>>>,
}

/// The ensemble's leader is killed while a client connected to it holds a lock and three
/// others wait: the holder keeps the lock (its session moves to another server), the waiters
/// proceed after the release, in order; the killed node is restarted.
pub(crate) async fn leader_killed() -> Outcome {
    let hosts = hosts(ENSEMBLE_VAR).map_err(Failure)?;
    let servers = Server::ensemble()?;
    let leader = leader_of(&servers)
        .await
        .cloned()
        .ok_or_else(|| Failure("no ensemble node reports `Mode: leader`".into()))?;
    // Long enough for an election and a reconnection; the point is that the session survives.
    let config = ZkConfig::new(hosts.clone()).session_timeout(Duration::from_secs(8));
    let (holder, holder_backend) = session_on(&leader, &config).await?;
    let name = unique_name("leader-killed")?;
    let options = LockOptions::new().wait(Duration::from_secs(60));
    let guard = holder.lock_with(&name, &options).await.map_err(err)?;
    let mut lost = guard.lost();
    let mut waiters = queue_waiters(&config, &name, &options).await?;

    let killed_at = Instant::now();
    let killed = leader.instance.stop().await?;
    let others: Vec<_> = servers
        .iter()
        .filter(|s| s.port != leader.port)
        .cloned()
        .collect();
    poll_until(
        Duration::from_secs(30),
        "a new leader elected",
        async || Ok(leader_of(&others).await.is_some()),
    )
    .await?;
    let elected = killed_at.elapsed();
    // Watch the holder for longer than a session timeout: it only stays held if renewals
    // succeed on the session's new server.
    let watch_for = holder_backend.session_timeout() + Duration::from_secs(2);
    keeps_holding(&guard, &mut lost, killed_at, watch_for).await?;
    let mut moved = false;
    for server in &others {
        moved |= server.serves_session(holder_backend.session_id()).await;
    }
    ensure!(moved, "the holder's session is not on a surviving node");
    still_shown(&holder, &name, &guard).await?;
    // No waiter finished: none got the lock (nor failed) while the holder held it.
    let finished = waiters.tasks.try_join_next();
    ensure!(
        finished.is_none() && locked(&waiters.fences).is_empty(),
        "a waiter finished while the holder held the lock ({finished:?}; fences taken {:?})",
        locked(&waiters.fences)
    );

    let fence = guard.fence();
    let released = Instant::now();
    guard.release().await.map_err(err)?;
    served_in_order(waiters, fence).await?;
    let handed_off = released.elapsed();
    leader.start_again(killed).await?;
    println!(
        "        leader on port {} killed; new leader after {elected:?}; holder kept fence {fence} on its moved session; 3 waiters served in {handed_off:?}",
        leader.port
    );
    Ok(())
}

/// A client whose session is on `server` (so that killing it moves the session), in at most
/// 30 tries.
async fn session_on(
    server: &Server,
    config: &ZkConfig,
) -> Result<(LockClient, ZkBackend), Failure> {
    for _ in 0..30 {
        let (client, backend) = client(config).await?;
        if server.serves_session(backend.session_id()).await {
            return Ok((client, backend));
        }
    }
    Err(Failure(
        "no session landed on the leader in 30 tries".into(),
    ))
}

/// Three waiters for `name`, each of its own client, queued one after another so the
/// expected order is known.
async fn queue_waiters(
    config: &ZkConfig,
    name: &LockName,
    options: &LockOptions,
) -> Result<Waiters, Failure> {
    let store = ZkStore::from_env(ENSEMBLE_VAR, Duration::from_secs(8))
        .await
        .map_err(Failure)?;
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    for i in 0..3 {
        let (waiter, _) = client(config).await?;
        tasks.spawn(take_record_release(
            i,
            waiter,
            name.clone(),
            options.clone(),
            fences.clone(),
        ));
        poll_until(Duration::from_secs(10), "a waiter queueing", async || {
            Ok(store.children(name).await.map_err(err)?.len() == i + 2)
        })
        .await?;
    }
    Ok(Waiters { tasks, fences })
}

/// Watches `guard` (and `lost`, its loss) until `watch_for` after `killed_at`: held all along, `lost()` never fired,
/// the fence unchanged.
async fn keeps_holding(
    guard: &LockGuard,
    lost: &mut Lost,
    killed_at: Instant,
    watch_for: Duration,
) -> Outcome {
    let fence = guard.fence();
    while killed_at.elapsed() < watch_for {
        ensure!(
            guard.is_held(),
            "the holder stopped holding {:?} after the leader was killed",
            killed_at.elapsed()
        );
        ensure!(
            lost.now_or_never().is_none(),
            "lost() fired after the leader was killed"
        );
        ensure!(guard.fence() == fence, "the fence changed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// `inspect` still shows `guard`'s hold of `name`.
async fn still_shown(holder: &LockClient, name: &LockName, guard: &LockGuard) -> Outcome {
    let info =
        holder.inspect(name).await.map_err(err)?.ok_or_else(|| {
            Failure("inspect shows the lock free while the holder holds it".into())
        })?;
    ensure!(
        info.token == *guard.lease().token() && info.fence == guard.fence(),
        "inspect shows another holder"
    );
    Ok(())
}

/// Every waiter gets the lock within 20 s of the release, with fences increasing from above
/// the holder's `fence`.
async fn served_in_order(mut waiters: Waiters, fence: Fence) -> Outcome {
    while let Some(joined) =
        tokio::time::timeout(Duration::from_secs(20), waiters.tasks.join_next())
            .await
            .map_err(|_| {
                Failure("the waiters did not all get the lock within 20 s of the release".into())
            })?
    {
        joined.map_err(err)??;
    }
    let order = locked(&waiters.fences).clone();
    ensure!(
        order.windows(2).all(|w| w[0] < w[1]) && order.first().is_some_and(|f| *f > fence),
        "the waiters' fences are not increasing after the holder's {fence}: {order:?}"
    );
    Ok(())
}

/// A holder connected only to a follower: the other two nodes (the leader among them) are
/// paused, so the follower is cut off from the quorum but still answers local reads until it
/// notices. A renewal it answers from its own state would extend the local deadline while the
/// leader may expire the session; so no renewal may succeed then (review finding 6).
pub(crate) async fn follower_cut_off() -> Outcome {
    let servers = Server::ensemble()?;
    let follower = follower_of(&servers).await?;
    let config = ZkConfig::new(format!("127.0.0.1:{}", servers[follower].port))
        .session_timeout(Duration::from_secs(6));
    let (client, _backend) = client(&config).await?;
    let name = unique_name("follower-cut-off")?;
    let guard = client
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let mut paused = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        if i != follower {
            paused.push(server.instance.pause()?);
        }
    }
    let extended = tokio::time::timeout(
        Duration::from_millis(1500),
        guard.extend(Duration::from_secs(6)),
    )
    .await;
    for pause in paused {
        pause.resume()?;
    }
    ensure!(
        !matches!(extended, Ok(Ok(()))),
        "a follower cut off from its leader confirmed the hold (extend returned Ok)"
    );
    poll_until(
        Duration::from_secs(30),
        "the ensemble serving again",
        async || {
            for server in &servers {
                if server.mode().await.is_none() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    drop(guard);
    Ok(())
}

/// In an ensemble the leader expires sessions, and learns that a session touched a follower
/// only from that follower's next ping answer, up to `tickTime`/2 later. A renewal answered by a
/// follower therefore keeps the session alive on the leader for the session timeout minus up to
/// half a tick from the renewal's send time: the lease's TTL, from which the guard's local
/// deadline is counted, must leave that half tick out (with `ZkConfig::server_tick` unset, the
/// most it can be: a quarter of the session timeout, since the server never negotiates less than
/// two ticks).
pub(crate) async fn leader_touch_lag_left_out() -> Outcome {
    let servers = Server::ensemble()?;
    let follower = &servers[follower_of(&servers).await?];
    let conf = follower
        .four_letters("conf")
        .await
        .ok_or_else(|| Failure("the follower did not answer `conf`".into()))?;
    let tick = conf
        .lines()
        .find_map(|l| l.strip_prefix("tickTime="))
        .and_then(|t| t.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| Failure(format!("no tickTime in the follower's `conf`: {conf}")))?;
    let config = ZkConfig::new(format!("127.0.0.1:{}", follower.port))
        .session_timeout(Duration::from_secs(4));
    let (client, backend) = client(&config).await?;
    let session = backend.session_timeout();
    let name = unique_name("leader-touch-lag")?;
    let guard = client
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let granted = guard.lease().ttl();
    guard.extend(Duration::from_secs(4)).await.map_err(err)?;
    let renewed = guard.lease().ttl();
    guard.release().await.map_err(err)?;
    for (what, ttl) in [("grant", granted), ("renewal", renewed)] {
        ensure!(
            ttl + tick / 2 <= session,
            "a {what} on a follower gave a lease of {ttl:?} for a {session:?} session: the leader may expire the session {:?} after the renewal was sent (tickTime {tick:?})",
            session - tick / 2
        );
    }
    Ok(())
}
