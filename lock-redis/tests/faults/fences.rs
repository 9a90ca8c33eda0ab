//! Fences: they grow past a lost counter, refuse counters this library did not write, and
//! (Redlock) grow across majorities that share one server.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{env_var, fail, unique_name},
};
use lock_core::{LockClient, LockError, LockName, LockOptions};
use lock_redis::{RedisKeys, RedlockBackend, RedlockConfig};
use redis::AsyncCommands;

use super::{raw_conn, redlock_client, redlock_raw_conns, single_client};

/// Acquires and releases `lock` `times` times; the last fence issued.
pub(super) async fn cycle(
    client: &LockClient,
    lock: &LockName,
    times: usize,
) -> Result<u64, Failure> {
    let mut last = 0;
    for _ in 0..times {
        let guard = client
            .lock_with(lock, &LockOptions::new())
            .await
            .map_err(fail("acquire"))?;
        last = guard.fence().get();
        guard.release().await.map_err(fail("release"))?;
    }
    Ok(last)
}

/// A fence counter that disappeared (evicted under an `allkeys-*` policy, or deleted by hand)
/// does not make fences go back.
pub(super) async fn fences_grow_after_the_counter_is_lost() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let client = single_client(&url).await?;
    let lock = unique_name("counter-lost")?;
    let before = cycle(&client, &lock, 3).await?;
    let mut conn = raw_conn(&url).await?;
    let deleted: i64 = conn
        .del(RedisKeys::new("faults", &lock).fence)
        .await
        .map_err(fail("DEL"))?;
    ensure!(deleted == 1, "there was no fence counter to delete");
    let after = cycle(&client, &lock, 1).await?;
    ensure!(
        after > before,
        "the fence after the counter was lost, {after}, is not above the fence before, {before}"
    );
    let _: i64 = conn
        .del(RedisKeys::new("faults", &lock).fence)
        .await
        .map_err(fail("DEL"))?;
    Ok(())
}

/// Fence counters this library cannot have written (negative, not canonical, or too large to
/// increase within the fence range) are refused with an error naming the counter, before
/// anything is written: no lock key, no change to the counter.
pub(super) async fn planted_fence_counters_are_refused() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let client = single_client(&url).await?;
    let mut conn = raw_conn(&url).await?;
    let options = LockOptions::new().wait(Duration::ZERO);
    for planted in [
        "9223372036854775806",
        "9223372036854775807",
        "9007199254740993",
        "-5",
        "-1",
        "007",
        "",
    ] {
        let lock = unique_name("planted-fence")?;
        let keys = RedisKeys::new("faults", &lock);
        let _: () = conn.set(&keys.fence, planted).await.map_err(fail("SET"))?;
        let result = client.lock_with(&lock, &options).await;
        let lock_exists: bool = conn.exists(&keys.lock).await.map_err(fail("EXISTS"))?;
        let counter: String = conn.get(&keys.fence).await.map_err(fail("GET"))?;
        let _: i64 = conn
            .del(&[&keys.fence, &keys.lock])
            .await
            .map_err(fail("DEL"))?;
        ensure!(
            matches!(&result, Err(LockError::Foreign { found, .. }) if found.contains(&keys.fence)),
            "a fence counter of {planted:?} gave {:?}",
            result.map(|g| g.fence())
        );
        ensure!(
            !lock_exists,
            "a fence counter of {planted:?} was refused but the lock key was written"
        );
        ensure!(
            counter == planted,
            "a refused fence counter of {planted:?} was changed to {counter:?}"
        );
    }
    Ok(())
}

/// Sends `CLIENT PAUSE ms WRITE` to the server at `url`: its scripts queue until it ends.
pub(super) async fn pause_writes(url: &str, ms: u64) -> Outcome {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query_async(&mut raw_conn(url).await?)
        .await
        .map_err(fail("CLIENT PAUSE"))?;
    Ok(())
}

/// Ends a `CLIENT PAUSE` on the server at `url`; its queued scripts then run in order.
pub(super) async fn unpause(url: &str) -> Outcome {
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut raw_conn(url).await?)
        .await
        .map_err(fail("CLIENT UNPAUSE"))?;
    Ok(())
}

/// Acquires `lock` on `client` while the server at `paused` holds back writes (so the
/// majority of the others grants it), releases it, and ends the pause; the fence.
async fn fence_without(client: &LockClient, lock: &LockName, paused: &str) -> Result<u64, Failure> {
    pause_writes(paused, 5_000).await?;
    let outcome = async {
        let options = LockOptions::new()
            .ttl(Duration::from_secs(2))
            .wait(Duration::from_secs(2));
        let guard = client
            .lock_with(lock, &options)
            .await
            .map_err(fail("acquire"))?;
        let fence = guard.fence().get();
        guard.release().await.map_err(fail("release"))?;
        Ok(fence)
    }
    .await;
    unpause(paused).await?;
    outcome
}

/// Redlock over three servers: two majorities share a server, so a fence must grow from one
/// to the next even when the servers' counters differ. Here n1's counter runs an hour ahead
/// (a server whose clock is ahead, or the grant-and-undo rounds of contended votes that reach
/// n1 alone); {n1, n2} grant the first acquisition, {n2, n3} the second.
pub(super) async fn redlock_fences_grow_across_majorities() -> Outcome {
    let urls: Vec<String> = env_var("LOCK_TEST_REDLOCK_URLS")?
        .split(',')
        .take(3)
        .map(str::to_owned)
        .collect();
    let [n1, _, n3] = urls.as_slice() else {
        return Err(Failure(
            "LOCK_TEST_REDLOCK_URLS lists fewer than 3 servers".into(),
        ));
    };
    let client = LockClient::new(
        RedlockBackend::connect(RedlockConfig::new(urls.clone()).key_prefix("faults"))
            .await
            .map_err(fail("redlock connect"))?,
    );
    let lock = unique_name("redlock-fences")?;
    let keys = RedisKeys::new("faults", &lock);
    let mut first = raw_conn(n1).await?;
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut first)
        .await
        .map_err(fail("TIME"))?;
    let ahead = seconds * 1_000_000 + micros + 3_600_000_000;
    let _: () = first.set(&keys.fence, ahead).await.map_err(fail("SET"))?;
    let outcome = async {
        let f1 = fence_without(&client, &lock, n3).await?;
        let f2 = fence_without(&client, &lock, n1).await?;
        ensure!(
            f2 > f1,
            "the fence granted by {{n2, n3}}, {f2}, is not above the one granted before by \
             {{n1, n2}}, {f1}"
        );
        Ok(())
    }
    .await;
    for url in &urls {
        let _: i64 = raw_conn(url)
            .await?
            .del(&keys.fence)
            .await
            .map_err(fail("DEL"))?;
    }
    outcome
}

/// An uncontended Redlock acquisition is one round of votes. The client proposes a fence
/// floor (its clock in µs and a second) that is above every server's counter and clock, so
/// every granting server issues that same fence and writes it to its own counter: there is
/// nothing to write back. Counted on the servers: one script call each (before, two: the vote
/// and the write-back round). Every server's counter holds the fence the guard has. The
/// counts are server-wide, so a call left running by an earlier case could add to one: each
/// server's count is the least of three acquisitions (background calls only add; the old
/// code made two on every server every time).
pub(super) async fn redlock_uncontended_acquire_is_one_round() -> Outcome {
    let client = redlock_client().await?;
    let mut raws = redlock_raw_conns().await?;
    // Loads the scripts on every server first (a server that does not know one answers the
    // first call with NOSCRIPT and runs it by source: two calls).
    cycle(&client, &unique_name("redlock-one-round-warm")?, 1).await?;
    let mut least: Vec<u64> = vec![u64::MAX; raws.len()];
    for _ in 0..3 {
        let lock = unique_name("redlock-one-round")?;
        let keys = RedisKeys::new("faults", &lock);
        let before = script_calls(&mut raws).await?;
        let guard = client
            .lock_with(&lock, &LockOptions::new().ttl(Duration::from_secs(30)))
            .await
            .map_err(fail("acquire"))?;
        let after = script_calls(&mut raws).await?;
        let mut counters = Vec::new();
        for raw in &mut raws {
            let counter: Option<u64> = raw.get(&keys.fence).await.map_err(fail("GET fence"))?;
            counters.push(counter);
        }
        let fence = guard.fence().get();
        guard.release().await.map_err(fail("release"))?;
        for ((least, a), b) in least.iter_mut().zip(&after).zip(&before) {
            *least = (*least).min(a.saturating_sub(*b));
        }
        ensure!(
            counters.iter().all(|&c| c == Some(fence)),
            "the servers' fence counters are {counters:?}; the guard's fence is {fence}"
        );
    }
    ensure!(
        least.iter().all(|&n| n == 1),
        "script calls per server for one uncontended acquisition (least of three): {least:?}, \
         expected one each"
    );
    Ok(())
}

/// Script calls (`EVALSHA` and `EVAL`) each server has served so far.
pub(super) async fn script_calls(
    raws: &mut [redis::aio::MultiplexedConnection],
) -> Result<Vec<u64>, Failure> {
    let mut calls = Vec::new();
    for raw in raws {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(raw)
            .await
            .map_err(fail("INFO commandstats"))?;
        let count = |command: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        calls.push(count("evalsha") + count("eval"));
    }
    Ok(calls)
}

/// The role of a child of this binary run under `faketime` with its wall clock an hour ahead
/// (see [`redlock_floor_far_ahead_of_the_servers_is_ignored`]).
pub(super) const SKEWED_ROLE: &str = "redlock-skewed";
/// The lock the skewed child takes.
const SKEWED_NAME_VAR: &str = "LOCK_FAULTS_SKEWED_NAME";
/// How far ahead the child's wall clock runs.
const SKEW_SECS: u64 = 3_600;

/// The skewed child: acquires the lock named by [`SKEWED_NAME_VAR`] on Redlock and prints
/// `GOT <fence> <its wall clock in s>`.
pub(super) fn skewed_child() -> std::process::ExitCode {
    let result = conformance_tests::runtime().and_then(|runtime| {
        runtime.block_on(async {
            let name = std::env::var(SKEWED_NAME_VAR).map_err(|e| e.to_string())?;
            let client = redlock_client().await.map_err(|Failure(why)| why)?;
            let guard = client
                .lock_with(name.as_str(), &LockOptions::new())
                .await
                .map_err(|e| e.to_string())?;
            println!("GOT {} {}", guard.fence().get(), wall_secs());
            guard.release().await.map_err(|e| e.to_string())
        })
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skewed client: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn wall_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A Redlock client whose wall clock runs an hour ahead proposes a fence floor an hour
/// ahead of the servers' clocks: the servers ignore it (a floor counts when it is at most
/// 5 s ahead of the server's clock), so its fence stays near their clocks and the counters
/// are not pushed an hour ahead (every later fence would be, and a client clock near 2^53 µs
/// would make the name unusable). The child reports its clock, so the test proves the skew
/// took effect.
pub(super) async fn redlock_floor_far_ahead_of_the_servers_is_ignored() -> Outcome {
    let faketime = env_var("LOCK_TEST_FAKETIME")?;
    let name = unique_name("redlock-skewed-floor")?;
    let keys = RedisKeys::new("faults", &name);
    let skew = i64::try_from(SKEW_SECS).map_err(fail("the skew"))?;
    let output = conformance_tests::holder_process::child_with_clock(SKEWED_ROLE, &faketime, skew)
        .map_err(Failure)?
        .env(SKEWED_NAME_VAR, name.as_str())
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .map_err(|_| Failure("the skewed client did not end within 30 s".into()))?
        .map_err(fail("running the skewed client"))?;
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    let words: Vec<&str> = said.split_whitespace().collect();
    let (fence, clock) = match words.as_slice() {
        ["GOT", fence, clock] => (
            fence.parse::<u64>().map_err(fail("the child's fence"))?,
            clock.parse::<u64>().map_err(fail("the child's clock"))?,
        ),
        _ => {
            return Err(Failure(format!(
                "the skewed client said {said:?} ({})",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
    };
    let mut raws = redlock_raw_conns().await?;
    let mut highest_clock = 0;
    for raw in &mut raws {
        let (seconds, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(raw)
            .await
            .map_err(fail("TIME"))?;
        highest_clock = highest_clock.max(seconds * 1_000_000 + micros);
        let _: i64 = raw.del(&keys.fence).await.map_err(fail("DEL"))?;
    }
    let off = clock.saturating_sub(wall_secs());
    ensure!(
        off + 60 >= SKEW_SECS,
        "the child's clock is {off} s ahead, not {SKEW_SECS} s: faketime did not take effect"
    );
    ensure!(
        fence < highest_clock + 5_000_000,
        "the skewed client's fence {fence} is {} s ahead of the servers' clocks",
        fence.saturating_sub(highest_clock) / 1_000_000
    );
    Ok(())
}
