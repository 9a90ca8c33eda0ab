//! The pub/sub connection of waiters: one per client however many locks it waits for, and a
//! connection that stops answering costs a waiter its push wake-ups, never its wait budget.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{Relay, env_var, fail, poll_until, unique_name},
};
use lock_core::{LockError, LockOptions};
use lock_redis::RedisKeys;
use redis::aio::MultiplexedConnection;

use super::{raw_conn, single_client, tcp_address, until_marked};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("a_denied_subscribe_is_retried_slowly", || {
            Box::pin(a_denied_subscribe_is_retried_slowly())
        })
        .case("a_refused_subscribe_keeps_the_other_subscriptions", || {
            Box::pin(a_refused_subscribe_keeps_the_other_subscriptions())
        })
        .case("a_release_whose_message_is_refused_still_releases", || {
            Box::pin(a_release_whose_message_is_refused_still_releases())
        })
        .case("a_dropped_client_closes_its_pubsub_connection", || {
            Box::pin(a_dropped_client_closes_its_pubsub_connection())
        })
        .case("waiters_share_one_pubsub_connection", || {
            Box::pin(waiters_share_one_pubsub_connection())
        })
        .case("half_open_pubsub_keeps_the_wait_budget", || {
            Box::pin(half_open_pubsub_keeps_the_wait_budget())
        })
}

/// Every waiting lock of one client shares one pub/sub connection.
pub(super) async fn waiters_share_one_pubsub_connection() -> Outcome {
    const LOCKS: usize = 10;
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let holder = single_client(&url).await?;
    let waiter = single_client(&url).await?;
    let mut conn = raw_conn(&url).await?;
    let before = pubsub_clients(&mut conn).await?;
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let mut channels = Vec::new();
    for i in 0..LOCKS {
        let lock = unique_name(&format!("shared-pubsub-{i}"))?;
        channels.push(RedisKeys::new("faults", &lock).channel);
        held.push(
            holder
                .lock_with(&lock, &LockOptions::new())
                .await
                .map_err(fail("acquire"))?,
        );
        let waiter = waiter.clone();
        waiting.push(tokio::spawn(async move {
            let options = LockOptions::new().wait(Duration::from_secs(10));
            waiter.lock_with(&lock, &options).await
        }));
    }
    let mut subscribed = 0;
    let all_subscribed = poll_until(
        Duration::from_secs(5),
        &format!("{LOCKS} waiters subscribing"),
        async || {
            subscribed = subscribers(&mut conn, &channels).await?;
            Ok(subscribed == LOCKS)
        },
    )
    .await;
    all_subscribed
        .map_err(|Failure(why)| Failure(format!("{why}: only {subscribed} subscribed")))?;
    let added = pubsub_clients(&mut conn).await?.saturating_sub(before);
    ensure!(
        added == 1,
        "{LOCKS} waiting locks of one client opened {added} pub/sub connections"
    );
    for guard in held {
        guard.release().await.map_err(fail("release"))?;
    }
    for task in waiting {
        let guard = task
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("waiter"))?;
        guard.release().await.map_err(fail("release"))?;
    }
    Ok(())
}

/// How many pub/sub connections the server has.
async fn pubsub_clients(conn: &mut MultiplexedConnection) -> Result<usize, Failure> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .map_err(fail("CLIENT LIST"))?;
    Ok(list.lines().filter(|l| !l.trim().is_empty()).count())
}

/// How many of the locks whose channel stems are `stems` have a waiter subscribed: each waiter
/// listens on its client's channel under the lock's stem.
pub(super) async fn subscribers(
    conn: &mut MultiplexedConnection,
    stems: &[String],
) -> Result<usize, Failure> {
    let mut subscribed = 0;
    for stem in stems {
        let active: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{stem}:*"))
            .query_async(conn)
            .await
            .map_err(fail("PUBSUB CHANNELS"))?;
        subscribed += usize::from(active.len() == 1);
    }
    Ok(subscribed)
}

/// Two waiters of a client whose pub/sub connection is half-open (accepted, never answered)
/// each return `Timeout` within their 300 ms budget: the subscription is bounded, and the
/// second waiter is not stuck behind the first.
pub(super) async fn half_open_pubsub_keeps_the_wait_budget() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let a = single_client(&url).await?;
    // The backend's first connection (its multiplexed one) is forwarded; the pub/sub
    // connection, opened when a waiter first subscribes, is not.
    let relay = Relay::start(tcp_address(&url)?).await?;
    relay.stall_after(1);
    let b = single_client(&format!("redis://{}", relay.addr())).await?;
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let budget = Duration::from_millis(300);
    for i in 0..2 {
        let lock = unique_name(&format!("half-open-pubsub-{i}"))?;
        held.push(
            a.lock_with(&lock, &options)
                .await
                .map_err(fail("acquire"))?,
        );
        let b = b.clone();
        waiting.push(tokio::spawn(async move {
            let start = Instant::now();
            let result = tokio::time::timeout(
                Duration::from_secs(3),
                b.lock_with(&lock, &LockOptions::new().wait(budget)),
            )
            .await;
            (start.elapsed(), result.map(|r| r.map(|g| g.fence())))
        }));
    }
    let mut outcome = Ok(());
    for (i, task) in waiting.into_iter().enumerate() {
        let (took, result) = task.await.map_err(fail("waiter task"))?;
        let checked = (|| {
            ensure!(
                matches!(result, Ok(Err(LockError::Timeout { .. }))),
                "waiter {i} with a {budget:?} budget and a half-open pub/sub connection gave \
                 {result:?} after {took:?} (Err(Elapsed) = still waiting after 3 s)"
            );
            ensure!(
                took <= budget + Duration::from_millis(300),
                "waiter {i} returned Timeout after {took:?} for a {budget:?} budget"
            );
            Ok(())
        })();
        outcome = outcome.and(checked);
    }
    for guard in held {
        guard.release().await.map_err(fail("release"))?;
    }
    drop(relay);
    outcome
}

/// A server that refuses a waiter's `SUBSCRIBE` (an ACL user without channel permissions)
/// costs the waiters their push wake-ups, not a loop: a subscription is tried again at most
/// about once a second, whatever the channel (here one client waits on four locks at once).
pub(super) async fn a_denied_subscribe_is_retried_slowly() -> Outcome {
    const WAIT: Duration = Duration::from_secs(2);
    const LOCKS: usize = 4;
    with_acl_user("resetchannels", async |url, user, admin| {
        let holder = single_client(url).await?;
        let waiter = single_client(&user.url).await?;
        let mut held = Vec::new();
        let mut waiting = Vec::new();
        for i in 0..LOCKS {
            let lock = unique_name(&format!("denied-subscribe-{i}"))?;
            held.push(
                holder
                    .lock_with(&lock, &LockOptions::new())
                    .await
                    .map_err(fail("holder's acquire"))?,
            );
            let waiter = waiter.clone();
            waiting.push(tokio::spawn(async move {
                let options = LockOptions::new().wait(WAIT);
                waiter.lock_with(&lock, &options).await.is_err()
            }));
        }
        for wait in waiting {
            let refused = wait.await.map_err(fail("waiter task"))?;
            ensure!(refused, "a waiter got a lock held elsewhere");
        }
        let denied = user.denials(admin).await?;
        ensure!(
            denied >= 1,
            "the server never refused a SUBSCRIBE: the case tests nothing"
        );
        ensure!(
            denied <= 4,
            "SUBSCRIBE was denied {denied} times in {WAIT:?} ({LOCKS} waiting locks): \
             subscriptions were tried again in a loop"
        );
        Ok(())
    })
    .await
}

/// A server that refuses the subscription of one lock's channel (an ACL that allows this
/// user only some channels) costs the waiters of that lock their push wake-ups, not the
/// waiters of the others: the client's pub/sub connection stays open, with its other
/// subscriptions, and their releases still wake them. (Before, the refusal closed the
/// connection, and with it every subscription of the client.)
pub(super) async fn a_refused_subscribe_keeps_the_other_subscriptions() -> Outcome {
    with_acl_user("resetchannels &*push-allowed*", async |url, user, admin| {
        let holder = single_client(url).await?;
        let waiter = single_client(&user.url).await?;
        let (allowed, refused) = (unique_name("push-allowed")?, unique_name("push-refused")?);
        let mut held = Vec::new();
        for lock in [&allowed, &refused] {
            held.push(
                holder
                    .lock_with(lock, &LockOptions::new())
                    .await
                    .map_err(fail("holder's acquire"))?,
            );
        }
        let first = {
            let (waiter, lock) = (waiter.clone(), allowed.clone());
            tokio::spawn(async move {
                let options = LockOptions::new().wait(Duration::from_secs(10));
                waiter.lock_with(&lock, &options).await
            })
        };
        let mut subscribed = Vec::new();
        poll_until(
            Duration::from_secs(5),
            "the waiter subscribing to the allowed lock's channel",
            async || {
                subscribed = user.subscribed_connections(admin).await?;
                Ok(!subscribed.is_empty())
            },
        )
        .await?;
        let options = LockOptions::new().wait(Duration::from_millis(500));
        ensure!(
            waiter.lock_with(&refused, &options).await.is_err(),
            "the waiter got a lock held elsewhere"
        );
        ensure!(
            user.channel_denials(admin, "push-refused").await? >= 1,
            "the server never refused the refused lock's channel: the case tests nothing"
        );
        let after = user.subscribed_connections(admin).await?;
        ensure!(
            after == subscribed,
            "pub/sub connections with subscriptions (client ids) were {subscribed:?} before \
             the refusal and {after:?} after: the refusal closed the others' subscriptions"
        );
        let mut held = held.into_iter();
        let released = Instant::now();
        if let Some(guard) = held.next() {
            guard.release().await.map_err(fail("release"))?;
        }
        let got = first
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("the waiter of the allowed lock"))?;
        let took = released.elapsed();
        got.release().await.map_err(fail("release"))?;
        for guard in held {
            guard.release().await.map_err(fail("release"))?;
        }
        ensure!(
            took <= Duration::from_millis(100),
            "the waiter of the allowed lock got it {took:?} after its release (push expected)"
        );
        Ok(())
    })
    .await
}

/// A client that is dropped closes its pub/sub connection, which it keeps open between waits.
pub(super) async fn a_dropped_client_closes_its_pubsub_connection() -> Outcome {
    with_acl_user("allchannels", async |url, user, admin| {
        let (_holder, waiter, lock) = waiting_behind_a_holder(url, user).await?;
        let options = LockOptions::new().wait(Duration::from_millis(300));
        ensure!(
            waiter.lock_with(&lock, &options).await.is_err(),
            "the waiter got a lock held elsewhere"
        );
        let opened = user.connections(admin).await?;
        ensure!(
            opened == 2,
            "a client that waited has {opened} connections; expected 2 (commands, pub/sub)"
        );
        drop(waiter);
        let mut left = opened;
        let closed = poll_until(
            Duration::from_secs(3),
            "the dropped client's connections closing",
            async || {
                left = user.connections(admin).await?;
                Ok(left == 0)
            },
        )
        .await;
        closed.map_err(|Failure(why)| Failure(format!("{why}: {left} left open")))
    })
    .await
}

/// A release whose message the server refuses (here the holder's ACL allows no channel, so
/// no `PUBLISH`) still releases, and says so: the script deleted the key before it published,
/// and an error from the publish made the caller believe the release failed while the lock
/// was free (a script's writes stay when it fails). The waiter, not woken, takes the lock at
/// the holder's expiry.
pub(super) async fn a_release_whose_message_is_refused_still_releases() -> Outcome {
    with_acl_user("resetchannels", async |url, user, admin| {
        let holder = single_client(&user.url).await?;
        let waiter = single_client(url).await?;
        let lock = unique_name("refused-message")?;
        let keys = RedisKeys::new("faults", &lock);
        let held = holder
            .lock_with(&lock, &LockOptions::new().ttl(Duration::from_secs(2)))
            .await
            .map_err(fail("holder's acquire"))?;
        let waiting = {
            let lock = lock.clone();
            tokio::spawn(async move {
                let options = LockOptions::new().wait(Duration::from_secs(10));
                waiter.lock_with(&lock, &options).await
            })
        };
        until_marked(admin, &keys, "the waiter").await?;
        held.release()
            .await
            .map_err(fail("a release whose message was refused"))?;
        ensure!(
            user.channel_denials(admin, &keys.channel).await? >= 1,
            "the server refused no message of the release: the case tests nothing"
        );
        let guard = waiting
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("the waiter after the release"))?;
        guard.release().await.map_err(fail("waiter's release"))
    })
    .await
}

/// Runs `case` with the test server's URL, a user of its own with the channel rules
/// `channels` (see [`AclUser::create`]) and an administrator's connection, and deletes the
/// user afterwards, whatever the outcome.
async fn with_acl_user(
    channels: &str,
    case: impl AsyncFnOnce(&str, &AclUser, &mut MultiplexedConnection) -> Outcome,
) -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let mut admin = raw_conn(&url).await?;
    let user = AclUser::create(&mut admin, &url, channels).await?;
    let outcome = case(&url, &user, &mut admin).await;
    user.delete(&mut admin).await;
    outcome
}

/// A holder's client holding a new lock, and a client of `user` to wait for it.
async fn waiting_behind_a_holder(
    url: &str,
    user: &AclUser,
) -> Result<
    (
        lock_core::LockGuard,
        lock_core::LockClient,
        lock_core::LockName,
    ),
    Failure,
> {
    let holder = single_client(url).await?;
    let lock = unique_name("pubsub-user")?;
    let held = holder
        .lock_with(&lock, &LockOptions::new())
        .await
        .map_err(fail("holder's acquire"))?;
    Ok((held, single_client(&user.url).await?, lock))
}

/// A Redis ACL user of its own for one case, so that its connections can be told apart.
struct AclUser {
    name: String,
    /// The server's URL, logged in as this user.
    url: String,
}

impl AclUser {
    /// Creates a user allowed every key and command, with the channel rules `channels`
    /// (separated by spaces).
    async fn create(
        admin: &mut MultiplexedConnection,
        url: &str,
        channels: &str,
    ) -> Result<Self, Failure> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(fail("clock"))?
            .subsec_nanos();
        let name = format!("faults-{}-{nanos}", std::process::id());
        let password = "faults-acl-password";
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&name)
            .arg("on")
            .arg(format!(">{password}"))
            .arg("~*")
            .arg("+@all")
            .arg(channels.split_whitespace().collect::<Vec<_>>())
            .query_async::<()>(admin)
            .await
            .map_err(fail("ACL SETUSER"))?;
        let address = url.trim_start_matches("redis://");
        let url = format!("redis://{name}:{password}@{address}");
        Ok(Self { name, url })
    }

    /// Deletes the user (the server closes its connections).
    async fn delete(&self, admin: &mut MultiplexedConnection) {
        let _: Result<(), _> = redis::cmd("ACL")
            .arg("DELUSER")
            .arg(&self.name)
            .query_async(admin)
            .await;
    }

    /// This user's lines of the server's `CLIENT LIST` (one per connection).
    async fn client_lines(
        &self,
        admin: &mut MultiplexedConnection,
    ) -> Result<Vec<String>, Failure> {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(admin)
            .await
            .map_err(fail("CLIENT LIST"))?;
        let mine = format!(" user={} ", self.name);
        Ok(list
            .lines()
            .filter(|line| line.contains(&mine))
            .map(str::to_owned)
            .collect())
    }

    /// How many connections the server has logged in as this user.
    async fn connections(&self, admin: &mut MultiplexedConnection) -> Result<usize, Failure> {
        Ok(self.client_lines(admin).await?.len())
    }

    /// The ids of this user's connections that have subscriptions (`sub` above 0 in
    /// `CLIENT LIST`), in order.
    async fn subscribed_connections(
        &self,
        admin: &mut MultiplexedConnection,
    ) -> Result<Vec<String>, Failure> {
        let field = |line: &str, name: &str| {
            line.split(' ')
                .find_map(|part| part.strip_prefix(name))
                .map(str::to_owned)
        };
        let mut ids: Vec<String> = self
            .client_lines(admin)
            .await?
            .iter()
            .filter(|line| field(line, "sub=").is_some_and(|n| n != "0"))
            .filter_map(|line| field(line, "id="))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// This user's entries of the server's ACL log, each as its text fields and its count.
    async fn log_entries(
        &self,
        admin: &mut MultiplexedConnection,
    ) -> Result<Vec<(HashMap<String, String>, i64)>, Failure> {
        let entries: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL")
            .arg("LOG")
            .query_async(admin)
            .await
            .map_err(fail("ACL LOG"))?;
        Ok(entries
            .into_iter()
            .map(|entry| {
                let count = match entry.get("count") {
                    Some(redis::Value::Int(count)) => *count,
                    _ => 0,
                };
                let text = entry
                    .into_iter()
                    .filter_map(|(key, value)| match value {
                        redis::Value::BulkString(bytes) => {
                            Some((key, String::from_utf8_lossy(&bytes).into_owned()))
                        }
                        _ => None,
                    })
                    .collect::<HashMap<_, _>>();
                (text, count)
            })
            .filter(|(text, _)| text.get("username") == Some(&self.name))
            .collect())
    }

    /// How many times the server's ACL log recorded this user denied a channel whose name
    /// contains `containing`.
    async fn channel_denials(
        &self,
        admin: &mut MultiplexedConnection,
        containing: &str,
    ) -> Result<i64, Failure> {
        Ok(self
            .log_entries(admin)
            .await?
            .iter()
            .filter(|(text, _)| {
                text.get("reason").map(String::as_str) == Some("channel")
                    && text.get("object").is_some_and(|o| o.contains(containing))
            })
            .map(|(_, count)| count)
            .sum())
    }

    /// How many of this user's commands the server's ACL log recorded as denied.
    async fn denials(&self, admin: &mut MultiplexedConnection) -> Result<i64, Failure> {
        Ok(self
            .log_entries(admin)
            .await?
            .iter()
            .map(|(_, count)| count)
            .sum())
    }
}
