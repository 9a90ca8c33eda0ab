//! Hand-over: a release gives the lock to the first waiter in line in the same script, so the
//! waiter holds it when the message arrives. A waiter that gives up as the lock is handed to it
//! must pass the lock on, or everyone behind it waits for its TTL.

use std::{
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{env_var, fail, poll_until, unique_name},
};
use lock_core::{LockClient, LockOptions};
use lock_redis::{RedisConfig, RedisKeys};
use redis::{AsyncCommands, aio::ConnectionLike};

use super::{
    client_of, cluster_client, cluster_urls, queue_line, raw_cluster_conn, raw_conn, single_client,
    until_marked,
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case(
            "a_lock_handed_to_a_waiter_that_leaves_goes_to_the_next",
            || Box::pin(a_lock_handed_to_a_waiter_that_leaves_goes_to_the_next()),
        )
        .case(
            "a_cluster_lock_handed_to_a_waiter_that_leaves_goes_to_the_next",
            || Box::pin(a_cluster_lock_handed_to_a_waiter_that_leaves_goes_to_the_next()),
        )
        .case("without_hand_over_a_release_gives_a_turn", || {
            Box::pin(without_hand_over_a_release_gives_a_turn())
        })
        .case("a_release_without_hand_over_hands_nothing_over", || {
            Box::pin(a_release_without_hand_over_hands_nothing_over())
        })
        .case(
            "a_hand_over_read_late_is_confirmed_before_it_is_held",
            || Box::pin(a_hand_over_read_late_is_confirmed_before_it_is_held()),
        )
}

/// A lock handed over to a waiter whose client was frozen for longer than half the waiter's
/// TTL: the message cannot be trusted on its own (its grant would be valid from the waiter's
/// last try, with less than half the TTL left), so the waiter's next try finds the lock its
/// own (`{4}`) and renews it before it answers (`confirm`). It gets the handed fence (the
/// lock was not lost and taken again) with the lock key renewed to its full TTL; a grant that
/// skipped the renewal would be trusted for a TTL from now while the server key had only what
/// was left of the hand-over's (here under a second of two).
pub(super) async fn a_hand_over_read_late_is_confirmed_before_it_is_held() -> Outcome {
    const TTL: Duration = Duration::from_secs(2);
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let mut raw = raw_conn(&url).await?;
    let holder = single_client(&url).await?;
    let waiter_options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(20));
    let line = OneInLine::waiting_with(
        &mut raw,
        &holder,
        connecting(&url, true),
        "handed-read-late",
        waiter_options,
    )
    .await?;
    let OneInLine {
        keys,
        held,
        mut waiter,
        token,
        ..
    } = line;
    let thaw = waiter.freeze().await?;
    held.release().await.map_err(fail("release"))?;
    let holder_now: Option<String> = raw.get(&keys.lock).await.map_err(fail("GET"))?;
    let handed_fence: Option<u64> = raw.get(&keys.fence).await.map_err(fail("GET fence"))?;
    // The fault: the waiter stays frozen past half its TTL after the hand-over (its last try
    // was sent before the freeze, earlier still).
    tokio::time::sleep(TTL.mul_f64(0.65)).await;
    let left_at_thaw: i64 = raw.pttl(&keys.lock).await.map_err(fail("PTTL"))?;
    drop(thaw);
    let outcome = async {
        ensure!(
            holder_now.as_deref() == Some(token.as_str()),
            "the release did not hand the lock to the waiter: the lock key holds {holder_now:?}"
        );
        ensure!(
            (1..TTL.as_millis() as i64 / 2).contains(&left_at_thaw),
            "the handed lock had {left_at_thaw} ms left when the waiter ran again"
        );
        let fence = waiter
            .acquired(Duration::from_secs(5))
            .await?
            .map_err(|e| Failure(format!("the waiter's acquisition failed: {e}")))?;
        let left: i64 = raw.pttl(&keys.lock).await.map_err(fail("PTTL"))?;
        let holder_after: Option<String> = raw.get(&keys.lock).await.map_err(fail("GET"))?;
        ensure!(
            Some(fence) == handed_fence,
            "the waiter got fence {fence}, the hand-over issued {handed_fence:?}"
        );
        ensure!(
            holder_after.as_deref() == Some(token.as_str()),
            "after the waiter's acquisition the lock key holds {holder_after:?}"
        );
        ensure!(
            left > TTL.as_millis() as i64 * 3 / 4,
            "the waiter's acquisition returned with {left} ms left on the lock key (TTL {TTL:?}): \
             the handed lock was not renewed before it was held"
        );
        Ok(())
    }
    .await;
    let _: () = raw.del(&keys.lock).await.map_err(fail("clean-up"))?;
    waiter.end()?;
    outcome
}

/// How the frozen waiter's thread makes its client (on its own runtime).
type Connect = Box<
    dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = Result<LockClient, Failure>>>> + Send,
>;

/// A waiter in a client of its own, on a thread and runtime of its own, which the test can
/// freeze (its thread blocks, so nothing of that client runs, while its connections stay
/// open) and whose acquisition it can abort.
struct FrozenWaiter {
    /// Aborts the waiter's `lock_with` task (it is dropped when its runtime runs again).
    abort: tokio::task::AbortHandle,
    /// The acquisition's outcome (the fence, or the error as text), once it returns; the
    /// guard stays held in the task until the thread ends.
    acquired: tokio::sync::mpsc::UnboundedReceiver<Result<u64, String>>,
    /// Blocks the waiter's thread, once it said so on the first channel, until the sender of
    /// the second is dropped.
    freeze: tokio::sync::mpsc::UnboundedSender<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
    /// Ends the thread (after a last moment for the tasks the abort spawned).
    thread: thread::JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl FrozenWaiter {
    /// Starts a client made by `connect` waiting for `name` with `options`.
    fn start(
        connect: Connect,
        name: lock_core::LockName,
        options: LockOptions,
    ) -> Result<Self, Failure> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (acquired_tx, acquired) = tokio::sync::mpsc::unbounded_channel();
        let (freeze, mut frozen) =
            tokio::sync::mpsc::unbounded_channel::<(mpsc::Sender<()>, mpsc::Receiver<()>)>();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = ready_tx.send(Err(Failure(format!("runtime: {error}"))));
                    return;
                }
            };
            runtime.block_on(async move {
                let client: LockClient = match connect().await {
                    Ok(client) => client,
                    Err(error) => {
                        let _ = ready_tx.send(Err(error));
                        return;
                    }
                };
                let task = tokio::spawn(async move {
                    let result = client.lock_with(&name, &options).await;
                    let outcome = result.as_ref().map(|guard| guard.fence().get());
                    let _ = acquired_tx.send(outcome.map_err(|e| e.to_string()));
                    result
                });
                let _ = ready_tx.send(Ok(task.abort_handle()));
                loop {
                    tokio::select! {
                        Some((blocked, until)) = frozen.recv() => {
                            // Blocks this runtime's only thread: the client is frozen.
                            let _ = blocked.send(());
                            let _ = until.recv();
                        }
                        _ = &mut stopped => break,
                    }
                }
                // The task's end (an abort) is the test's business; dropping the runtime
                // ends whatever it spawned.
                drop(task);
            });
        });
        let abort = ready_rx.recv().map_err(fail("the waiter's thread"))??;
        Ok(Self {
            abort,
            acquired,
            freeze,
            thread,
            stop,
        })
    }

    /// Freezes the waiter's thread (returns once it is blocked); it runs again when the
    /// returned sender is dropped.
    async fn freeze(&self) -> Result<mpsc::Sender<()>, Failure> {
        let (thaw, until) = mpsc::channel();
        let (blocked, is_blocked) = mpsc::channel();
        self.freeze
            .send((blocked, until))
            .map_err(|_| Failure("the waiter's thread ended".into()))?;
        tokio::task::spawn_blocking(move || is_blocked.recv())
            .await
            .map_err(fail("waiting for the freeze"))?
            .map_err(|_| Failure("the waiter's thread ended before it froze".into()))?;
        Ok(thaw)
    }

    /// The acquisition's outcome, waiting up to `limit` for it.
    async fn acquired(&mut self, limit: Duration) -> Result<Result<u64, String>, Failure> {
        tokio::time::timeout(limit, self.acquired.recv())
            .await
            .ok()
            .flatten()
            .ok_or_else(|| Failure(format!("the waiter did not acquire within {limit:?}")))
    }

    fn end(self) -> Outcome {
        let _ = self.stop.send(());
        self.thread
            .join()
            .map_err(|_| Failure("the waiter's thread panicked".into()))
    }
}

/// A holder releases while its first waiter's client is frozen (its connections open, so the
/// release message counts as heard): the lock is handed over to that waiter. Its acquisition is
/// then dropped, and it runs again: leaving the queue, it must release the lock it was handed
/// and hand it on, so the second waiter gets it at once, not after the first one's 30 s TTL.
pub(super) async fn a_lock_handed_to_a_waiter_that_leaves_goes_to_the_next() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let raw = raw_conn(&url).await?;
    let connect = connecting(&url, true);
    handed_to_a_leaver(raw, connect, async || single_client(&url).await).await
}

/// The same on a cluster, where the hand-over's message goes on a shard channel (`SPUBLISH`,
/// and `PUBSUB SHARDNUMSUB` to see that the waiter's client listens).
pub(super) async fn a_cluster_lock_handed_to_a_waiter_that_leaves_goes_to_the_next() -> Outcome {
    let urls = cluster_urls()?;
    let raw = raw_cluster_conn(&urls).await?;
    let connect: Connect = Box::new({
        let urls = urls.clone();
        move || Box::pin(async move { cluster_client(&urls).await })
    });
    handed_to_a_leaver(raw, connect, async || cluster_client(&urls).await).await
}

/// The case, with `raw` a plain connection to the store, `connect` making the first waiter's
/// client (on its own thread), and `client` the holder's and the second waiter's.
async fn handed_to_a_leaver<C: ConnectionLike + Send + Sync>(
    mut raw: C,
    connect: Connect,
    client: impl AsyncFn() -> Result<LockClient, Failure>,
) -> Outcome {
    let holder = client().await?;
    let line = OneInLine::start(&mut raw, &holder, connect, "handed-to-a-leaver").await?;
    let OneInLine {
        name,
        keys,
        options,
        held,
        waiter: first,
        token: first_token,
    } = line;
    let second = client().await?;
    let waiting = tokio::spawn({
        let (name, options) = (name.clone(), options.clone().wait(Duration::from_secs(5)));
        async move {
            let guard = second.lock_with(&name, &options).await?;
            let got = Instant::now();
            let fence = guard.fence();
            guard.release().await?;
            Ok::<_, lock_core::LockError>((got, fence))
        }
    });
    poll_until(
        Duration::from_secs(10),
        "the second waiter queueing",
        async || {
            let queued: usize = raw.zcard(&keys.queue).await.map_err(fail("ZCARD"))?;
            Ok(queued == 2)
        },
    )
    .await?;
    let thaw = first.freeze().await?;
    held.release().await.map_err(fail("release"))?;
    let holder_now: Option<String> = raw.get(&keys.lock).await.map_err(fail("GET"))?;
    let handed_fence: Option<u64> = raw.get(&keys.fence).await.map_err(fail("GET fence"))?;
    first.abort.abort();
    drop(thaw);
    let outcome = async {
        ensure!(
            holder_now.as_deref() == Some(first_token.as_str()),
            "the release did not hand the lock to the first waiter: the lock key holds \
             {holder_now:?}, its token is {first_token}"
        );
        let thawed = Instant::now();
        let (got, fence) = waiting
            .await
            .map_err(fail("second waiter task"))?
            .map_err(fail("the second waiter"))?;
        let took = got.saturating_duration_since(thawed);
        ensure!(
            took <= Duration::from_secs(2),
            "the second waiter got the lock {took:?} after the first one left"
        );
        ensure!(
            handed_fence.is_some_and(|handed| fence.get() > handed),
            "the second waiter's fence {} is not above the one handed to the first ({handed_fence:?})",
            fence.get()
        );
        Ok(())
    }
    .await;
    first.end()?;
    outcome
}

/// A client of the single test server with hand-overs turned off (`hand_over=false`).
async fn client_without_hand_over(url: &str) -> Result<LockClient, Failure> {
    client_of(
        RedisConfig::single(url)
            .key_prefix("faults")
            .hand_over(false),
    )
    .await
}

/// What makes the frozen waiter's client of the single test server at `url`, with hand-overs
/// on or off.
fn connecting(url: &str, hand_over: bool) -> Connect {
    let url = url.to_owned();
    Box::new(move || {
        Box::pin(async move {
            if hand_over {
                single_client(&url).await
            } else {
                client_without_hand_over(&url).await
            }
        })
    })
}

/// With `hand_over=false` a waiter records no TTL with its client, so a release does not hand it
/// the lock even while its client listens (here frozen, its connections open): the lock is
/// free after the release, and the waiter takes it by a try of its own once it runs again,
/// within its 100 ms turn.
pub(super) async fn without_hand_over_a_release_gives_a_turn() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let holder = client_without_hand_over(&url).await?;
    turn_instead(&url, &holder, false).await
}

/// A release of a client with `hand_over=false` hands nothing over, even to a waiter of a
/// client that takes hand-overs (it records its TTL): that waiter gets a turn.
pub(super) async fn a_release_without_hand_over_hands_nothing_over() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let holder = client_without_hand_over(&url).await?;
    turn_instead(&url, &holder, true).await
}

/// `holder` holds a lock with one waiter in line (a client with hand-overs on or off,
/// `records_ttl`: on, it records its TTL), frozen when `holder` releases: the release must
/// leave the lock free, and the waiter must take it by a try of its own once it runs again.
async fn turn_instead(url: &str, holder: &LockClient, records_ttl: bool) -> Outcome {
    let mut raw = raw_conn(url).await?;
    let connect = connecting(url, records_ttl);
    let line = OneInLine::start(&mut raw, holder, connect, "no-hand-over").await?;
    let OneInLine {
        keys,
        held,
        waiter,
        token,
        ..
    } = line;
    let entry: Option<String> = raw
        .hget(&keys.clients, &token)
        .await
        .map_err(fail("HGET clients"))?;
    let thaw = waiter.freeze().await?;
    held.release().await.map_err(fail("release"))?;
    let holder_now: Option<String> = raw.get(&keys.lock).await.map_err(fail("GET"))?;
    drop(thaw);
    let outcome = async {
        ensure!(
            entry
                .as_deref()
                .is_some_and(|entry| entry.contains(' ') == records_ttl),
            "the waiter recorded its client as {entry:?}; with a TTL: {records_ttl} expected"
        );
        ensure!(
            holder_now.is_none(),
            "the release handed the lock over ({holder_now:?}) with hand_over=false"
        );
        let thawed = std::time::Instant::now();
        poll_until(
            Duration::from_secs(5),
            "the waiter taking the lock",
            async || {
                let now: Option<String> = raw.get(&keys.lock).await.map_err(fail("GET"))?;
                Ok(now.as_deref() == Some(token.as_str()))
            },
        )
        .await?;
        let took = thawed.elapsed();
        ensure!(
            took <= Duration::from_secs(2),
            "the waiter took the lock {took:?} after it ran again"
        );
        Ok(())
    }
    .await;
    let _: () = raw.del(&keys.lock).await.map_err(fail("clean-up"))?;
    waiter.end()?;
    outcome
}

/// A lock held by one client with one waiter in line behind it, the waiter's client on a
/// thread of its own ([`FrozenWaiter`]); both ask for a 30 s TTL.
struct OneInLine {
    name: lock_core::LockName,
    keys: RedisKeys,
    options: LockOptions,
    held: lock_core::LockGuard,
    waiter: FrozenWaiter,
    /// The waiter's token, as its place in the queue names it.
    token: String,
}

impl OneInLine {
    /// `holder` takes a new lock (named after `tag`), and a client made by `connect` waits for
    /// it; returns once that waiter has queued and marked the lock (`raw` watches the keys).
    async fn start<C: ConnectionLike + Send + Sync>(
        raw: &mut C,
        holder: &LockClient,
        connect: Connect,
        tag: &str,
    ) -> Result<Self, Failure> {
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(20));
        Self::waiting_with(raw, holder, connect, tag, options).await
    }

    /// As [`OneInLine::start`], the waiter asking with `waiter_options` (the holder asks for
    /// a 30 s TTL).
    async fn waiting_with<C: ConnectionLike + Send + Sync>(
        raw: &mut C,
        holder: &LockClient,
        connect: Connect,
        tag: &str,
        waiter_options: LockOptions,
    ) -> Result<Self, Failure> {
        let name = unique_name(tag)?;
        let keys = RedisKeys::new("faults", &name);
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(20));
        let held = holder
            .lock_with(&name, &options)
            .await
            .map_err(fail("first acquire"))?;
        let waiter = FrozenWaiter::start(connect, name.clone(), waiter_options)?;
        until_marked(raw, &keys, "the waiter").await?;
        let line = queue_line(raw, &keys).await?;
        let [token] = line.as_slice() else {
            return Err(Failure(format!(
                "expected one waiter in line, found {line:?}"
            )));
        };
        let token = token.clone();
        Ok(Self {
            name,
            keys,
            options,
            held,
            waiter,
            token,
        })
    }
}
