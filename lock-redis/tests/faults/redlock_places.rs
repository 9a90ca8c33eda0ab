//! Redlock waiters keep their places in the servers' queues without loading the servers, and
//! a server where a waiter does not listen does not take it for a dead one.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{fail, poll_until},
};
use futures::StreamExt;
use lock_core::{LockClient, LockOptions};
use lock_redis::{RedlockBackend, RedlockConfig};
use redis::{AsyncCommands, aio::MultiplexedConnection};

use super::{
    monitor, queue::until_queued_everywhere, redlock_client, redlock_held, redlock_raw_conns,
    redlock_urls,
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("redlock_waiters_far_back_vote_seldom", || {
            Box::pin(redlock_waiters_far_back_vote_seldom())
        })
        .case("redlock_waiters_deep_in_line_keep_places_seldom", || {
            Box::pin(redlock_waiters_deep_in_line_keep_places_seldom())
        })
        .case(
            "redlock_waiter_behind_paused_ones_takes_a_lock_left_free",
            || Box::pin(redlock_waiter_behind_paused_ones_takes_a_lock_left_free()),
        )
        .case(
            "redlock_waiter_deep_in_line_follows_a_turn_it_found",
            || Box::pin(redlock_waiter_deep_in_line_follows_a_turn_it_found()),
        )
        .case(
            "redlock_waiter_records_its_client_only_where_it_listens",
            || Box::pin(redlock_waiter_records_its_client_only_where_it_listens()),
        )
}

/// A subscribed Redlock waiter third in line votes only to keep its place, about once a
/// second (its place lasts 3 s), not four to five times a second as the first two do: a
/// release names the first two, so its votes could only be refused. Three waiting clients
/// behind a holder; the first server's `MONITOR` counts the third one's votes for 2.5 s.
async fn redlock_waiters_far_back_vote_seldom() -> Outcome {
    const WINDOW: Duration = Duration::from_millis(2500);
    let seen = calls_in_line("redlock-far-back", 3, 2, WINDOW).await?;
    ensure!(
        seen.others > 0,
        "the first two waiters did not vote either in {WINDOW:?}: the case tests nothing"
    );
    ensure!(
        (1..=5).contains(&seen.watched),
        "the third waiter voted {} times in {WINDOW:?} on one server (the first two: {}); it \
         keeps a 3 s place",
        seen.watched,
        seen.others
    );
    Ok(())
}

/// A subscribed Redlock waiter deep in line (ninth or further back) keeps its place with one
/// light call every 2.25 to 3 s (its place there lasts 9 s; a vote's, 3 s), not with a vote
/// about once a second as the third to eighth do: with 1,000 waiting clients, their votes
/// were most of what the servers ran per hand-off. Ten waiting clients behind a holder; the
/// first server's `MONITOR` counts the tenth one's calls for 5 s (at most its vote as it
/// subscribes and two light calls; before, a vote every 0.75 to 1 s, five or more), and every
/// server must still keep its place afterwards.
async fn redlock_waiters_deep_in_line_keep_places_seldom() -> Outcome {
    const WINDOW: Duration = Duration::from_secs(5);
    let seen = calls_in_line("redlock-deep", 10, 9, WINDOW).await?;
    ensure!(
        seen.others > 0,
        "the other waiters did not vote either in {WINDOW:?}: the case tests nothing"
    );
    ensure!(
        (1..=3).contains(&seen.watched),
        "the tenth waiter called the first server {} times in {WINDOW:?} (the others: {}); it \
         keeps a 9 s place every 2.25 to 3 s",
        seen.watched,
        seen.others
    );
    ensure!(
        seen.kept_everywhere,
        "the tenth waiter's place was gone from a server after {WINDOW:?}"
    );
    Ok(())
}

/// How many paused waiters [`redlock_waiter_behind_paused_ones_takes_a_lock_left_free`] plants
/// ahead of the live one: as many as puts it deep in line, where it only keeps its place.
const PAUSED: usize = 8;

/// A Redlock lock whose holder died (its lease ends with no release) while the waiters at the head
/// of the line are paused (planted: places that would last a minute, their client recorded and
/// listening, so the servers take them for live), with one live waiter behind them, ninth: it takes
/// the lock within 8 s of the lease's end. Its next call finds the lock free and votes (within 3
/// s), each vote starts a paused waiter's turn (400 ms), and it calls again when that turn is over,
/// which finds the turn's place ran out and votes, taking each paused one out of the line in turn:
/// at most about 3 s + 8 x 0.4 s. A waiter that voted only to keep its place (every 0.75 to 1 s)
/// needed two votes per paused waiter, one to start its turn and one to take its lapsed place out.
async fn redlock_waiter_behind_paused_ones_takes_a_lock_left_free() -> Outcome {
    const BOUND: Duration = Duration::from_secs(8);
    let name = conformance_tests::faults::unique_name("redlock-behind-paused")?;
    let keys = lock_redis::RedisKeys::new("faults", &name);
    let ttl = Duration::from_secs(1);
    let held = redlock_client()
        .await?
        .lock_with(&name, &LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .map_err(fail("holder's acquire"))?;
    let ends = Instant::now() + ttl;
    let mut raws = redlock_raw_conns().await?;
    let (paused, _listeners) = plant_paused(&mut raws, &keys).await?;
    let waiting = wait_behind(&name).await?;
    until_queued_everywhere(&mut raws, &keys, PAUSED + 1).await?;
    let (guard, acquired) = waiting.await.map_err(fail("waiter task"))?;
    let guard = guard.map_err(fail("acquire behind paused waiters"))?;
    let took = acquired.saturating_duration_since(ends);
    guard.release().await.map_err(fail("release"))?;
    drop(held);
    ensure!(
        took <= BOUND,
        "the live waiter behind {PAUSED} paused ones took the lock {took:?} after the holder's \
         lease ended (bound {BOUND:?})"
    );
    paused_are_gone(&mut raws, &keys, &paused).await
}

/// A subscribed Redlock waiter deep in line whose light call (`KEEP`) finds the lock free
/// during another waiter's turn calls again when that turn is over, and votes when that
/// call finds the turn's place ran out, the lock still free: the waiter whose turn it was may
/// be paused, and with every waiter nearer the head paused too nobody else votes. Here
/// [`PAUSED`] paused waiters are planted at the head, a live one queues ninth, the holder
/// releases, and the first paused one's turn is kept running (its place pushed to end 350 ms
/// ahead, every 100 ms) until the first server's `MONITOR` shows the live waiter's `KEEP`;
/// then it stops, and the live waiter must vote within 1.5 s of that `KEEP`. A waiter that
/// took the turn for a held lock slept 2.25 to 3 s before its next call.
async fn redlock_waiter_deep_in_line_follows_a_turn_it_found() -> Outcome {
    const BOUND: Duration = Duration::from_millis(1500);
    let (name, keys, held) = redlock_held("redlock-follows-turn").await?;
    let mut raws = redlock_raw_conns().await?;
    let (paused, _listeners) = plant_paused(&mut raws, &keys).await?;
    let waiting = wait_behind(&name).await?;
    until_queued_everywhere(&mut raws, &keys, PAUSED + 1).await?;
    let line: Vec<String> = raws[0]
        .zrange(&keys.queue, -1, -1)
        .await
        .map_err(fail("ZRANGE"))?;
    let live = line
        .first()
        .filter(|token| !paused.contains(token))
        .ok_or_else(|| Failure(format!("the live waiter is not last in line: {line:?}")))?
        .clone();
    held.release().await.map_err(fail("holder's release"))?;
    // The first paused waiter's turn, kept running until `stop` is sent.
    let first = paused[0].clone();
    let mut pushers = redlock_raw_conns().await?;
    push_place_end(&mut pushers, &keys, &first).await?;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let pushing = tokio::spawn({
        let keys = keys.clone();
        async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return Ok::<(), Failure>(()),
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                push_place_end(&mut pushers, &keys, &first).await?;
            }
        }
    });
    let (kept, voted) = keep_then_vote(&keys, &live, stop).await?;
    pushing.await.map_err(fail("pushing task"))??;
    let (guard, _) = waiting.await.map_err(fail("waiter task"))?;
    guard
        .map_err(fail("acquire behind paused waiters"))?
        .release()
        .await
        .map_err(fail("release"))?;
    ensure!(
        kept,
        "the live waiter made no light call in 8 s: the case tests nothing"
    );
    // The pushes leave the turn at least 250 ms when the `KEEP` runs: a vote much sooner means
    // that `KEEP` found no turn (the pushes stalled), so nothing was tested.
    ensure!(
        voted.is_none_or(|after| after >= Duration::from_millis(100)),
        "the live waiter voted {voted:?} after its light call, too soon for a call that found a \
         turn running: the case tests nothing"
    );
    ensure!(
        voted.is_some_and(|after| after <= BOUND),
        "the live waiter voted {voted:?} after its light call found a turn running, which then \
         ran out (bound {BOUND:?})"
    );
    paused_are_gone(&mut raws, &keys, &paused).await
}

/// Watches the first Redlock server's `MONITOR` for `live`'s first `KEEP` on the lock of
/// `keys`, sends `stop` then (dropped unsent otherwise), and for its first vote after that: whether
/// the `KEEP` came (within 8 s), and how long after it the vote came (within 8 s of the start).
async fn keep_then_vote(
    keys: &lock_redis::RedisKeys,
    live: &str,
    stop: tokio::sync::oneshot::Sender<()>,
) -> Result<(bool, Option<Duration>), Failure> {
    let mut monitor = monitor(&redlock_urls()?.remove(0)).await?;
    // KEEP's first two keys are the lock and the queue, a vote's the lock and the fence (a
    // release's, the lock and the waiter mark).
    let keep = format!("\"4\" \"{}\" \"{}\"", keys.lock, keys.queue);
    let vote = format!("\"6\" \"{}\" \"{}\"", keys.lock, keys.fence);
    let token = format!("\"{live}\"");
    // When the live waiter's first light call came, and its first vote after it.
    let (mut kept_at, mut voted) = (None::<Instant>, None);
    let mut stop = Some(stop);
    let watch = Instant::now() + Duration::from_secs(8);
    while let Ok(Some(line)) = tokio::time::timeout_at(watch.into(), monitor.next()).await {
        if !line.contains(&token) {
            continue;
        }
        match kept_at {
            None if line.contains(&keep) => {
                kept_at = Some(Instant::now());
                // The turn runs out at most 350 ms from now.
                if let Some(stop) = stop.take() {
                    // An error only says the pushing task is gone (it failed; the caller says so).
                    let _ = stop.send(());
                }
            }
            Some(kept) if line.contains(&vote) => {
                voted = Some(kept.elapsed());
                break;
            }
            _ => {}
        }
    }
    Ok((kept_at.is_some(), voted))
}

/// Plants [`PAUSED`] waiters at the head of the line on every server (places that would last a
/// minute, their client recorded and listening, so the servers take them for live ones
/// paused): their tokens, and the subscriptions by which their client listens.
async fn plant_paused(
    raws: &mut [MultiplexedConnection],
    keys: &lock_redis::RedisKeys,
) -> Result<(Vec<String>, Vec<redis::aio::PubSub>), Failure> {
    let paused: Vec<String> = (0..PAUSED)
        .map(|i| format!("0123456789abcdef0123456789abcd{i:02}"))
        .collect();
    let mut listeners = Vec::new();
    for (raw, url) in raws.iter_mut().zip(redlock_urls()?) {
        for (ticket, token) in (1..).zip(&paused) {
            super::queue::plant_dead_waiter_as(raw, keys, token, ticket).await?;
        }
        // The line's keys last as long as those places: the live waiter's first vote would
        // otherwise set them to expire with its own 3 s place, and a call after that would
        // find no line at all.
        for key in [&keys.queue, &keys.places, &keys.clients] {
            let _: () = raw.pexpire(key, 60_000).await.map_err(fail("PEXPIRE"))?;
        }
        // Their client listens: paused, not dead, so no server takes them out of the line.
        let mut listener = redis::Client::open(url.as_str())
            .map_err(fail("client"))?
            .get_async_pubsub()
            .await
            .map_err(fail("pubsub"))?;
        listener
            .subscribe(format!("{}:4242", keys.channel))
            .await
            .map_err(fail("SUBSCRIBE"))?;
        listeners.push(listener);
    }
    Ok((paused, listeners))
}

/// A live waiter of its own client on `name`, for 30 s: its answer and when it came.
async fn wait_behind(
    name: &lock_core::LockName,
) -> Result<
    tokio::task::JoinHandle<(Result<lock_core::LockGuard, lock_core::LockError>, Instant)>,
    Failure,
> {
    let waiter = redlock_client().await?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(30));
    let name = name.clone();
    Ok(tokio::spawn(async move {
        let guard = waiter.lock_with(&name, &options).await;
        (guard, Instant::now())
    }))
}

/// Moves `token`'s place end to 350 ms after each server's clock, where it has a place.
async fn push_place_end(
    raws: &mut [MultiplexedConnection],
    keys: &lock_redis::RedisKeys,
    token: &str,
) -> Outcome {
    for raw in raws {
        let _: i64 = redis::Script::new(
            "local t = redis.call('TIME') \
             return redis.call('ZADD', KEYS[1], 'XX', 'CH', \
               tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + 350, ARGV[1])",
        )
        .key(&keys.places)
        .arg(token)
        .invoke_async(raw)
        .await
        .map_err(fail("push a place's end"))?;
    }
    Ok(())
}

/// Checks on every server that no paused waiter of [`plant_paused`] keeps a place, then removes
/// the lock's queue keys.
async fn paused_are_gone(
    raws: &mut [MultiplexedConnection],
    keys: &lock_redis::RedisKeys,
    paused: &[String],
) -> Outcome {
    for raw in raws {
        // Gone, or over: a server that missed one vote (its time-out) may still list a paused
        // waiter whose place ended with its turn.
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(raw)
            .await
            .map_err(fail("TIME"))?;
        let now_ms = secs * 1_000 + micros / 1_000;
        for token in paused {
            let ends: Option<u64> = raw
                .zscore(&keys.places, token)
                .await
                .map_err(fail("ZSCORE places"))?;
            ensure!(
                ends.is_none_or(|ends| ends <= now_ms),
                "a paused waiter kept a place after its turn, until {ends:?} (server ms; now \
                 {now_ms})"
            );
        }
        let _: () = raw
            .del(&[&keys.queue, &keys.places, &keys.clients, &keys.fence])
            .await
            .map_err(fail("clean-up"))?;
    }
    Ok(())
}

/// What [`calls_in_line`] saw.
struct Seen {
    /// Script calls (`EVALSHA`) on the lock by the watched waiter.
    watched: usize,
    /// Script calls on the lock by anyone else.
    others: usize,
    /// The watched waiter still had a place on every server at the end of the window.
    kept_everywhere: bool,
}

/// Queues `waiters` clients (each its own) one by one behind a holder of a new Redlock lock tagged
/// `tag`, then counts on the first server's `MONITOR`, for `window`, the script calls on the lock's
/// key of the waiter at `index` in line and of everyone else (each call is one `EVALSHA`; the
/// `EVAL` that follows one the server refused, not knowing the script yet, is not counted again);
/// then looks whether that waiter still has a place on every server, releases the lock, and waits
/// for every waiter to take and release it.
async fn calls_in_line(
    tag: &str,
    waiters: usize,
    index: usize,
    window: Duration,
) -> Result<Seen, Failure> {
    let (lock, keys, held) = redlock_held(tag).await?;
    let mut raws = redlock_raw_conns().await?;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let mut waiting = Vec::new();
    for queued in 1..=waiters {
        let waiter = redlock_client().await?;
        let (lock, options) = (lock.clone(), options.clone().wait(Duration::from_secs(30)));
        waiting.push(tokio::spawn(async move {
            let guard = waiter.lock_with(&lock, &options).await?;
            guard.release().await
        }));
        until_queued_everywhere(&mut raws, &keys, queued).await?;
    }
    let line: Vec<String> = raws[0]
        .zrange(&keys.queue, 0, -1)
        .await
        .map_err(fail("ZRANGE"))?;
    let watched = line
        .get(index)
        .ok_or_else(|| Failure(format!("{} waiters in line", line.len())))?
        .clone();
    let mut monitor = monitor(&redlock_urls()?.remove(0)).await?;
    let mut seen = Seen {
        watched: 0,
        others: 0,
        kept_everywhere: true,
    };
    let end = Instant::now() + window;
    while let Ok(Some(line)) = tokio::time::timeout_at(end.into(), monitor.next()).await {
        if line.contains("\"EVALSHA\"") && line.contains(&format!("\"{}\"", keys.lock)) {
            if line.contains(&format!("\"{watched}\"")) {
                seen.watched += 1;
            } else {
                seen.others += 1;
            }
        }
    }
    for raw in &mut raws {
        let place: Option<f64> = raw
            .zscore(&keys.places, &watched)
            .await
            .map_err(fail("ZSCORE places"))?;
        seen.kept_everywhere &= place.is_some();
    }
    held.release().await.map_err(fail("holder's release"))?;
    for waiter in waiting {
        waiter
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("a waiter"))?;
    }
    Ok(seen)
}

/// The user the last Redlock server knows the waiter of
/// [`redlock_waiter_records_its_client_only_where_it_listens`] by: it may run every command on
/// every key, but use no channel, so its subscriptions are refused.
const DEAF_USER: &str = "faults-no-channels";

/// A Redlock waiter records its client (by which a release names it, and a server judges
/// whether it still listens) only on the servers where its subscription is confirmed. Here the
/// last server refuses it every channel (an ACL user of its own there), so that server must
/// keep no client for the waiter, whose later votes it still takes: else it would take the
/// live waiter for a dead one and drop it from its line at every release. Before, a vote
/// recorded the client on every server once a majority of subscriptions was confirmed.
async fn redlock_waiter_records_its_client_only_where_it_listens() -> Outcome {
    let mut urls = redlock_urls()?;
    let mut raws = redlock_raw_conns().await?;
    let last = raws.len() - 1;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            DEAF_USER,
            "on",
            ">deaf",
            "~*",
            "resetchannels",
            "+@all",
        ])
        .query_async(&mut raws[last])
        .await
        .map_err(fail("ACL SETUSER"))?;
    urls[last] = urls[last].replacen("redis://", &format!("redis://{DEAF_USER}:deaf@"), 1);
    let outcome = unheard_on_the_last(&urls, &mut raws).await;
    let _: () = redis::cmd("ACL")
        .arg(&["DELUSER", DEAF_USER])
        .query_async(&mut raws[last])
        .await
        .map_err(fail("ACL DELUSER"))?;
    outcome
}

/// The body of [`redlock_waiter_records_its_client_only_where_it_listens`]: the waiter's
/// client reaches the servers through `urls`, the case looks through `raws`.
async fn unheard_on_the_last(urls: &[String], raws: &mut [MultiplexedConnection]) -> Outcome {
    let (lock, keys, held) = redlock_held("redlock-unheard").await?;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let waiter = LockClient::new(
        RedlockBackend::connect(RedlockConfig::new(urls.to_vec()).key_prefix("faults"))
            .await
            .map_err(fail("redlock connect"))?,
    );
    let waiting = tokio::spawn({
        let (lock, options) = (lock.clone(), options.clone().wait(Duration::from_secs(15)));
        async move { waiter.lock_with(&lock, &options).await?.release().await }
    });
    until_queued_everywhere(raws, &keys, 1).await?;
    let token: String = raws[0]
        .zrange::<_, Vec<String>>(&keys.queue, 0, 0)
        .await
        .map_err(fail("ZRANGE"))?
        .pop()
        .ok_or_else(|| Failure("nobody in line".into()))?;
    let Some((deaf, heard)) = raws.split_last_mut() else {
        return Err(Failure("no Redlock servers".into()));
    };
    poll_until(
        Duration::from_secs(5),
        "the waiter's client recorded where it listens",
        async || {
            let mut everywhere = true;
            for raw in heard.iter_mut() {
                let client: Option<String> = raw
                    .hget(&keys.clients, &token)
                    .await
                    .map_err(fail("HGET clients"))?;
                everywhere &= client.is_some();
            }
            Ok(everywhere)
        },
    )
    .await?;
    // A vote after those that recorded the client: the place's end moves with each vote.
    let place = |raw: &mut MultiplexedConnection| {
        let (places, token) = (keys.places.clone(), token.clone());
        let mut raw = raw.clone();
        async move {
            raw.zscore::<_, _, Option<u64>>(&places, &token)
                .await
                .map_err(fail("ZSCORE places"))
        }
    };
    let before = place(deaf).await?;
    poll_until(
        Duration::from_secs(5),
        "another vote of the waiter on the last server",
        async || Ok(place(deaf).await? != before),
    )
    .await?;
    let recorded: Option<String> = deaf
        .hget(&keys.clients, &token)
        .await
        .map_err(fail("HGET clients"))?;
    held.release().await.map_err(fail("holder's release"))?;
    waiting
        .await
        .map_err(fail("waiter task"))?
        .map_err(fail("the waiter"))?;
    ensure!(
        recorded.is_none(),
        "the last server, which refuses the waiter its subscription, recorded its client \
         {recorded:?}: it would take the live waiter for a dead one"
    );
    Ok(())
}
