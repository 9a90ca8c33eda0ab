//! The standalone server paused (SIGSTOP) past the session timeout: the holder learns it lost
//! the lock in time, and after SIGCONT the waiter gets it on a new session; the lost holder's
//! backend forgets its lease.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_until, unique_name},
};
use lock_core::{
    LockClient, LockError, LockGuard, LockName, LockOptions, LossReason, backend::LockBackend as _,
};
use lock_zookeeper::{ZkBackend, ZkConfig};
use tokio::task::JoinHandle;

use super::{
    client,
    servers::Server,
    support::{STANDALONE_VAR, ZkStore, hosts},
};

/// A waiter in the background.
type Waiting = JoinHandle<Result<LockGuard, LockError>>;

/// The standalone server is paused past the session timeout: the holder's `lost()` fires
/// within the timeout, the waiter does not finish while the server is paused, and after the
/// resume the waiter gets the lock on a new session; the lost holder's backend forgets its
/// lease, its late release changes nothing, and its backend opens a new session for its next
/// acquisition.
pub(crate) async fn server_paused() -> Outcome {
    let server = Server::named("zookeeper")?;
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let timeout = Duration::from_secs(2);
    let config = ZkConfig::new(hosts).session_timeout(timeout);
    let (holder, holder_backend) = client(&config).await?;
    let (waiter, waiter_backend) = client(&config).await?;
    let name = unique_name("paused")?;
    let guard = holder
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let fence = guard.fence();
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(60));
            waiter.lock_with(&name, &options).await
        }
    });
    until_queued(&name).await?;
    let (old_holder_session, old_waiter_session) =
        (holder_backend.session_id(), waiter_backend.session_id());

    let (lost_after, reason, waiting) =
        pause_past_the_session(&server, &guard, waiting, timeout).await?;
    let resumed_at = Instant::now();
    let next = next_after_resume(waiting, &name, &waiter_backend).await?;
    let took = resumed_at.elapsed();
    ensure!(
        next.fence() > fence,
        "fence {} after the lost holder's {fence}",
        next.fence()
    );
    ensure!(
        waiter_backend.session_id() != old_waiter_session,
        "the waiter did not move to a new session"
    );
    forgotten_with_the_session(&holder_backend, &guard, timeout).await?;
    late_release_changes_nothing(&holder, guard, next, &name).await?;
    // The old holder's backend opens a new session for its next acquisition.
    let again = holder
        .lock_with(&name, &LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .map_err(err)?;
    ensure!(
        holder_backend.session_id() != old_holder_session,
        "the holder's backend did not open a new session"
    );
    again.release().await.map_err(err)?;
    println!(
        "        lost() after {lost_after:?} ({reason}); after resume the waiter got the lock on a new session in {took:?}"
    );
    Ok(())
}

/// The lost holder's backend no longer keeps its lease: a renewal that finds the session
/// ended forgets it (lock-core releases no hold lost with its session, so nothing else would
/// take it out), and a renewal after that answers `NotHeld`. The watchdog's renewal may have
/// been the first; this one is then `NotHeld` already.
async fn forgotten_with_the_session(
    backend: &ZkBackend,
    guard: &LockGuard,
    ttl: Duration,
) -> Outcome {
    let lease = guard.lease();
    let first = backend.renew(&lease, ttl).await;
    ensure!(
        matches!(
            first,
            Err(LockError::Lost {
                reason: LossReason::SessionEnded,
                ..
            } | LockError::NotHeld { .. })
        ),
        "a renewal of the lease whose session ended answered {first:?}"
    );
    let second = backend.renew(&lease, ttl).await;
    ensure!(
        matches!(second, Err(LockError::NotHeld { .. })),
        "a second renewal of the lease whose session ended answered {second:?}: the backend \
         still keeps the lease"
    );
    Ok(())
}

/// Waits until the waiter's node is queued behind the holder's.
async fn until_queued(name: &LockName) -> Outcome {
    let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(10))
        .await
        .map_err(Failure)?;
    poll_until(Duration::from_secs(10), "the waiter queueing", async || {
        Ok(store.children(name).await.map_err(err)?.len() == 2)
    })
    .await
}

/// Pauses `server` for 5 s, past what the client allows a session (7/5 of its `timeout`)
/// without the server, so both clients give their sessions up: `guard`'s `lost()` must fire
/// within the session timeout, and `waiting` must not finish meanwhile. Returns when `lost()`
/// fired and why, and the waiter, after the resume.
async fn pause_past_the_session(
    server: &Server,
    guard: &LockGuard,
    waiting: Waiting,
    timeout: Duration,
) -> Result<(Duration, LossReason, Waiting), Failure> {
    let paused = server.instance.pause()?;
    let paused_at = Instant::now();
    tracing::info!("test: server paused");
    let reason = tokio::time::timeout(timeout * 2, guard.lost())
        .await
        .map_err(|_| {
            Failure(format!(
                "lost() did not fire within {:?} of the pause",
                timeout * 2
            ))
        })?;
    let lost_after = paused_at.elapsed();
    ensure!(!guard.is_held(), "is_held() is true after lost()");
    ensure!(
        lost_after <= timeout,
        "lost() fired {lost_after:?} into the pause, after the {timeout:?} session timeout"
    );
    // The fault lasts this long; no condition to wait for.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(paused_at.elapsed())).await;
    if waiting.is_finished() {
        paused.resume()?;
        let result = waiting.await.map_err(err)?;
        return Err(Failure(format!(
            "the waiter finished while the server was paused: {result:?}"
        )));
    }
    paused.resume()?;
    tracing::info!("test: server resumed");
    Ok((lost_after, reason, waiting))
}

/// The waiter's guard, within 20 s of the resume; otherwise what the lock node and the
/// waiter's backend show.
async fn next_after_resume(
    mut waiting: Waiting,
    name: &LockName,
    waiter_backend: &ZkBackend,
) -> Result<LockGuard, Failure> {
    match tokio::time::timeout(Duration::from_secs(20), &mut waiting).await {
        Ok(joined) => joined
            .map_err(err)?
            .map_err(|e| Failure(format!("the waiter failed: {e}"))),
        Err(_) => {
            let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(10))
                .await
                .map_err(Failure)?;
            let children = store.children(name).await.map_err(err)?;
            waiting.abort();
            Err(Failure(format!(
                "the waiter did not get the lock within 20 s of the resume; the lock node has {children:?}; waiter {waiter_backend:?} sent {:?}",
                waiter_backend.operations()
            )))
        }
    }
}

/// The lost holder's release answers `Lost` and changes nothing for `next`, the new holder;
/// then `next` releases.
async fn late_release_changes_nothing(
    holder: &LockClient,
    lost: LockGuard,
    next: LockGuard,
    name: &LockName,
) -> Outcome {
    let released = lost.release().await;
    ensure!(
        matches!(released, Err(LockError::Lost { .. })),
        "releasing the lost hold returned {released:?}, expected Lost"
    );
    let info = holder.inspect(name).await.map_err(err)?;
    ensure!(
        info.is_some_and(|i| i.token == *next.lease().token()) && next.is_held(),
        "the lost holder's late release disturbed the new holder"
    );
    next.release().await.map_err(err)
}
