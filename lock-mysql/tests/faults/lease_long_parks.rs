//! The lease's waiters far back in the queue: they park long (a thousand waiters must not each
//! cost the server a batch a second), and a release wakes a long parker that has come near
//! the head, and so do waiters ahead that give up, so dead waiters ahead of it stall the lock
//! no longer than their turns.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{err, unique_name},
};
use lock_core::{LockClient, LockName, LockOptions};
use lock_mysql::Strategy;
use sqlx::AssertSqlSafe;

use super::{
    client,
    lease_parks::{PARK, plant_lease, recorded_client},
    lease_queue::plant_place,
    places, spawn_acquire,
    support::{
        MySqlStore, hex,
        proxy::{Proxy, Recording},
    },
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("lease/a_waiter_far_back_parks_long", || {
            Box::pin(lease_far_back_parks_long())
        })
        .case(
            "lease/a_long_parker_near_the_head_wakes_at_the_release",
            || Box::pin(lease_long_parker_wakes_at_the_release()),
        )
        .case("lease/waiters_leaving_wake_a_long_parker", || {
            Box::pin(lease_waiters_leaving_wake_a_long_parker())
        })
}

/// The turn of each planted (dead) waiter's place.
const TURN: Duration = Duration::from_millis(300);

/// Plants three dead waiters' places (live for a minute, each with a turn of [`TURN`]) on
/// `name`, in this order; answers their tokens.
async fn plant_three(store: &MySqlStore, name: &LockName) -> Result<[&'static str; 3], Failure> {
    let tokens = [
        "0123456789abcdef0123456789abcde1",
        "0123456789abcdef0123456789abcde2",
        "0123456789abcdef0123456789abcde3",
    ];
    for token in tokens {
        plant_place(store, name, token, TURN).await?;
    }
    Ok(tokens)
}

/// How many parks `recording` holds.
fn parks(recording: &Recording) -> usize {
    let (texts, _) = recording.commands();
    texts.iter().filter(|t| t.contains(PARK)).count()
}

/// The label of a long park's statement.
const LONG_PARK: &str = "lock-mysql park long";

/// How many long parks `recording` holds.
fn long_parks(recording: &Recording) -> usize {
    let (texts, _) = recording.commands();
    texts.iter().filter(|t| t.contains(LONG_PARK)).count()
}

/// Until the waiter of `recording` has sent its first long park (its first park may be short:
/// a client parks long only once its anchor is up, raised at its first park).
async fn until_parked_long(recording: &Recording) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(10);
    while long_parks(recording) == 0 {
        ensure!(
            Instant::now() < deadline,
            "the waiter sent no long park in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Deletes the place of `token` on `name` (as a waiter that gave up does).
async fn take_place_out(store: &MySqlStore, name: &LockName, token: &str) -> Outcome {
    let queue = format!("`{}_queue`", store.config().table_name().as_str());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DELETE FROM {queue} WHERE name = X'{}' AND token = '{token}'",
        hex(name.as_str())
    )))
    .execute(store.admin())
    .await
    .map_err(|e| Failure(format!("deleting a place: {e}")))?;
    Ok(())
}

/// A waiter parked long behind a holder of 30 s and three dead waiters' places (see
/// [`plant_three`]), its statements recorded.
struct FarBack {
    store: MySqlStore,
    name: LockName,
    recording: Recording,
    held: lock_core::LockGuard,
    waiting: tokio::task::JoinHandle<Result<lock_core::LockGuard, lock_core::LockError>>,
    tokens: [&'static str; 3],
    _proxy: Proxy,
}

impl FarBack {
    /// Sets it up on a fresh name from `label`, until the waiter has sent its first long park.
    async fn park(label: &str) -> Result<Self, Failure> {
        let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
        let (waiter, recording, proxy) = recorded_client(&store).await?;
        let holder: LockClient = client(store.config()).await?;
        let name = unique_name(label)?;
        let long = LockOptions::new().ttl(Duration::from_secs(30));
        let held = holder.lock_with(&name, &long).await.map_err(err)?;
        let tokens = plant_three(&store, &name).await?;
        let waiting = spawn_acquire(&waiter, &name, long.wait(Duration::from_secs(20)));
        until_parked_long(&recording).await?;
        Ok(Self {
            store,
            name,
            recording,
            held,
            waiting,
            tokens,
            _proxy: proxy,
        })
    }

    /// Releases the holder; answers how long after the release the waiter had the lock (and
    /// releases it).
    async fn release(self) -> Result<Duration, Failure> {
        let released = Instant::now();
        self.held.release().await.map_err(err)?;
        let next = self.waiting.await.map_err(err)?.map_err(err)?;
        let took = released.elapsed();
        next.release().await.map_err(err)?;
        Ok(took)
    }
}

/// A holder of 30 s and a waiter behind three places: the waiter, far back, parks longer
/// than a second: no second park for 2.5 s after its first long one. (Before, every park lasted a
/// second at most, so a thousand waiters sent a thousand park batches a second between them
/// and the server answered none in time.) Then the places ahead go and the release hands the
/// lease to the waiter, waking its long park.
async fn lease_far_back_parks_long() -> Outcome {
    const WATCHED: Duration = Duration::from_millis(2500);
    let far = FarBack::park("parks-long").await?;
    let before = parks(&far.recording);
    // Not seeing a second park for a while is the point: a park of a second would show.
    let watched = Instant::now();
    while watched.elapsed() < WATCHED && parks(&far.recording) == before {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = parks(&far.recording) - before + 1;
    for token in far.tokens {
        take_place_out(&far.store, &far.name, token).await?;
    }
    let woke = far.release().await?;
    ensure!(
        seen == 1,
        "a waiter with three places ahead sent {seen} parks within {:?} of its first (one long park expected)",
        watched.elapsed()
    );
    ensure!(
        woke < Duration::from_secs(1),
        "the release woke the long parker it handed the lease to only after {woke:?}"
    );
    Ok(())
}

/// Two dead waiters first in line (planted places), a third place, and a waiter behind them
/// that parks long. The third place goes (its waiter gave up), so the waiter is third in line
/// while it sleeps its long park; the release hands the lease to the first dead waiter and
/// must wake the waiter too, which then finds the two dead waiters' turns run out and takes
/// the lock within about two turns. (A waiter left asleep would take it only when its long
/// park ends, seconds later: the stall of two dead waiters in a row would be the long park,
/// not their turns.)
async fn lease_long_parker_wakes_at_the_release() -> Outcome {
    let far = FarBack::park("long-parker-woken").await?;
    take_place_out(&far.store, &far.name, far.tokens[2]).await?;
    let took = far.release().await?;
    let bound = TURN * 2 + Duration::from_millis(1400);
    ensure!(
        took <= bound,
        "behind two dead waiters with turns of {TURN:?}, the waiter took the lock {took:?} after the release (bound {bound:?}): its long park was not woken"
    );
    Ok(())
}

/// Until the queue of `store` holds `count` places for `name` (10 s at most).
async fn until_places(store: &MySqlStore, name: &LockName, count: i64) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(10);
    while places(store, name).await? < count {
        ensure!(
            Instant::now() < deadline,
            "the queue held fewer than {count} places after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// A holder that died (a lease row planted for 4 s),
/// three live waiters queued first, and a fourth that parks long behind them. (The three are
/// clients of a pool of one connection: they poll and queue without waiting for the lock's
/// gate, so the fourth, which takes the gate, queues behind them.) The three give
/// up (their `acquire` calls are dropped, which leaves in the background) while the fourth
/// sleeps its long park, and nobody releases: the lease runs out. Leaving must wake the long
/// parker, which is then first, so it takes the lock soon after the expiry and not when its
/// long park ends. (Found by the fault campaign, whose waiters give up every 2 s: the waiters
/// near the head all left while those behind slept long parks, and the free lock stalled for
/// up to 9.4 s.)
async fn lease_waiters_leaving_wake_a_long_parker() -> Outcome {
    const LEFT: Duration = Duration::from_secs(4);
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let (waiter, recording, _proxy) = recorded_client(&store).await?;
    let name = unique_name("leavers-wake-long")?;
    let planted = plant_lease(&store, &name, LEFT).await?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(20));
    // The clients stay: dropping a client's last handle closes its pool, and a dropped
    // `acquire` can then not take its place out (it lapses).
    let (mut first, mut leavers) = (Vec::new(), Vec::new());
    for count in 1..=3 {
        let leaver: LockClient = client(&store.config().clone().pool_size(1)).await?;
        first.push(spawn_acquire(&leaver, &name, options.clone()));
        leavers.push(leaver);
        until_places(&store, &name, count).await?;
    }
    let waiting = spawn_acquire(&waiter, &name, options);
    until_parked_long(&recording).await?;
    let left = planted.elapsed();
    for leaver in &first {
        leaver.abort();
    }
    ensure!(
        left + Duration::from_secs(1) < LEFT,
        "set-up too slow: the waiter parked long {left:?} after the lease was planted for {LEFT:?}"
    );
    let next = waiting.await.map_err(err)?.map_err(err)?;
    let took = planted.elapsed();
    next.release().await.map_err(err)?;
    let bound = LEFT + Duration::from_millis(1200);
    ensure!(
        took <= bound,
        "the three waiters ahead left {left:?} after a lease of {LEFT:?} was planted; the waiter parked long behind them took the lock {took:?} after it (bound {bound:?}): leaving did not wake its long park"
    );
    Ok(())
}
