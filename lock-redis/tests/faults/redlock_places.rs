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
    queue::until_queued_everywhere, redlock_client, redlock_held, redlock_raw_conns, redlock_urls,
};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases
        .case("redlock_waiters_far_back_vote_seldom", || {
            Box::pin(redlock_waiters_far_back_vote_seldom())
        })
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
    let (lock, keys, held) = redlock_held("redlock-far-back").await?;
    let mut raws = redlock_raw_conns().await?;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let mut waiting = Vec::new();
    for queued in 1..=3 {
        let waiter = redlock_client().await?;
        let (lock, options) = (lock.clone(), options.clone().wait(Duration::from_secs(15)));
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
    let third = line
        .get(2)
        .ok_or_else(|| Failure(format!("{} waiters in line", line.len())))?
        .clone();
    let first_url = redlock_urls()?.remove(0);
    let mut monitor = redis::Client::open(first_url.as_str())
        .map_err(fail("client"))?
        .get_async_monitor()
        .await
        .map_err(fail("MONITOR"))?
        .into_on_message::<String>();
    let (mut votes, mut others) = (0, 0);
    let end = Instant::now() + WINDOW;
    while let Ok(Some(line)) = tokio::time::timeout_at(end.into(), monitor.next()).await {
        let vote = line.contains("\"EVALSHA\"") || line.contains("\"EVAL\"");
        if vote && line.contains(&format!("\"{}\"", keys.lock)) {
            if line.contains(&format!("\"{third}\"")) {
                votes += 1;
            } else {
                others += 1;
            }
        }
    }
    held.release().await.map_err(fail("holder's release"))?;
    for waiter in waiting {
        waiter
            .await
            .map_err(fail("waiter task"))?
            .map_err(fail("a waiter"))?;
    }
    ensure!(
        others > 0,
        "the first two waiters did not vote either in {WINDOW:?}: the case tests nothing"
    );
    ensure!(
        (1..=5).contains(&votes),
        "the third waiter voted {votes} times in {WINDOW:?} on one server (the first two: \
         {others}); it keeps a 3 s place"
    );
    Ok(())
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
