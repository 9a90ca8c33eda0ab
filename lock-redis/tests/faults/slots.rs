//! A cluster's slot moves to another node while a client waits for a lock in it.

use std::time::{Duration, Instant};

use conformance_tests::{
    Cases, Failure, Outcome, ensure,
    faults::{fail, poll_until, unique_name},
};
use lock_core::{Backoff, LockOptions};
use lock_redis::RedisKeys;
use redis::{AsyncCommands, aio::MultiplexedConnection};

use super::{cluster_client, cluster_urls, handed_over, raw_conn};

/// The cases of this file.
pub(super) fn cases(cases: Cases<Failure>) -> Cases<Failure> {
    cases.case("a_waiter_hears_releases_after_its_slot_moves", || {
        Box::pin(a_waiter_hears_releases_after_its_slot_moves())
    })
}

/// A waiter subscribed to its release channel hears the release after the lock's slot moved
/// to another node. The node that gave the slot away ends the shard channel's subscription
/// (`sunsubscribe`), and the waiter subscribes again on the new node; before, it went on
/// counting as subscribed, heard nothing, and took the lock only at the holder's expiry.
async fn a_waiter_hears_releases_after_its_slot_moves() -> Outcome {
    let urls = cluster_urls()?;
    let mut nodes = Vec::new();
    for url in &urls {
        nodes.push(Node::connect(url).await?);
    }
    let name = unique_name("slot-moves")?;
    let keys = RedisKeys::new("faults", &name);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&keys.lock)
        .query_async(&mut nodes[0].conn)
        .await
        .map_err(fail("CLUSTER KEYSLOT"))?;
    let mut owner = None;
    for (i, node) in nodes.iter_mut().enumerate() {
        if node.owns(slot).await? {
            owner = Some(i);
        }
    }
    let from = owner.ok_or_else(|| Failure(format!("no node owns slot {slot}")))?;
    let to = (from + 1) % nodes.len();
    let options = LockOptions::new().ttl(Duration::from_secs(20));
    let held = cluster_client(&urls)
        .await?
        .lock_with(&name, &options)
        .await
        .map_err(fail("holder's acquire"))?;
    let waiter = cluster_client(&urls).await?;
    // A waiter that is not woken tries again only after 10 s: within 2 s of the release, only
    // a release message can bring it.
    let slow = Backoff::new(Duration::from_secs(10), Duration::from_secs(10));
    let waiting = tokio::spawn({
        let options = options.clone().wait(Duration::from_secs(15)).backoff(slow);
        let name = name.clone();
        async move {
            let guard = waiter.lock_with(&name, &options).await?;
            let got = Instant::now();
            guard.release().await?;
            Ok::<_, lock_core::LockError>(got)
        }
    });
    let channel = waiting_channel(&mut nodes[from].conn, &keys).await?;
    poll_until(
        Duration::from_secs(5),
        "the waiter subscribing on the slot's node",
        async || nodes[from].subscribers(&channel).await.map(|n| n == 1),
    )
    .await?;
    let outcome = async {
        move_slot(&mut nodes, slot, from, to).await?;
        poll_until(
            Duration::from_secs(5),
            "the waiter subscribing again on the slot's new node",
            async || nodes[to].subscribers(&channel).await.map(|n| n == 1),
        )
        .await?;
        let took = handed_over(held, waiting).await?;
        ensure!(
            took < Duration::from_secs(2),
            "the waiter took the lock {took:?} after the release (the holder's TTL is 20 s)"
        );
        Ok(())
    }
    .await;
    let put_back = put_back(&mut nodes, slot, from).await;
    outcome.and(put_back)
}

/// Gives `slot` back to node `home`, whatever a move left half done: every node forgets a
/// migration under way (`SETSLOT STABLE`), and the slot moves home if another node has it.
async fn put_back(nodes: &mut [Node], slot: u16, home: usize) -> Outcome {
    for node in nodes.iter_mut() {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("STABLE")
            .query_async(&mut node.conn)
            .await
            .map_err(fail("SETSLOT STABLE"))?;
    }
    let mut owner = None;
    for (i, node) in nodes.iter_mut().enumerate() {
        if node.owns(slot).await? {
            owner = Some(i);
        }
    }
    match owner {
        Some(owner) if owner == home => Ok(()),
        Some(owner) => move_slot(nodes, slot, owner, home).await,
        None => Err(Failure(format!("no node owns slot {slot} after the case"))),
    }
}

/// The release channel of the one waiter queued on `keys` (read on the slot's node).
async fn waiting_channel(
    conn: &mut MultiplexedConnection,
    keys: &RedisKeys,
) -> Result<String, Failure> {
    let mut line: Vec<String> = Vec::new();
    poll_until(Duration::from_secs(5), "the waiter queueing", async || {
        line = conn
            .zrange(&keys.queue, 0, -1)
            .await
            .map_err(fail("ZRANGE"))?;
        Ok(!line.is_empty())
    })
    .await?;
    let client: Option<String> = conn
        .hget(&keys.clients, &line[0])
        .await
        .map_err(fail("HGET clients"))?;
    let client = client.ok_or_else(|| Failure("the waiter's client is not recorded".into()))?;
    // Recorded as "<client> <ttl ms>".
    let client = client.split(' ').next().unwrap_or_default();
    Ok(format!("{}:{client}", keys.channel))
}

/// One node of the test cluster, reached directly.
struct Node {
    conn: MultiplexedConnection,
    id: String,
    host: String,
    port: u16,
}

impl Node {
    async fn connect(url: &str) -> Result<Self, Failure> {
        let mut conn = raw_conn(url).await?;
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut conn)
            .await
            .map_err(fail("CLUSTER MYID"))?;
        let address = url.trim_start_matches("redis://");
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| Failure(format!("no port in {url}")))?;
        let port = port.trim_end_matches('/').parse().map_err(fail("port"))?;
        Ok(Self {
            conn,
            id,
            host: host.to_owned(),
            port,
        })
    }

    /// Whether this node serves `slot` (by its own `CLUSTER NODES` line).
    async fn owns(&mut self, slot: u16) -> Result<bool, Failure> {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.conn)
            .await
            .map_err(fail("CLUSTER NODES"))?;
        let me = nodes
            .lines()
            .find(|line| line.contains("myself"))
            .ok_or_else(|| Failure("no `myself` in CLUSTER NODES".into()))?;
        // Fields 9 and on: the slots served, single or `low-high`.
        Ok(me.split(' ').skip(8).any(|range| {
            let (low, high) = range.split_once('-').unwrap_or((range, range));
            match (low.parse::<u16>(), high.parse::<u16>()) {
                (Ok(low), Ok(high)) => (low..=high).contains(&slot),
                _ => false,
            }
        }))
    }

    /// How many clients of this node subscribe to the shard channel `channel`.
    async fn subscribers(&mut self, channel: &str) -> Result<i64, Failure> {
        let reply: (String, i64) = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(channel)
            .query_async(&mut self.conn)
            .await
            .map_err(fail("PUBSUB SHARDNUMSUB"))?;
        Ok(reply.1)
    }
}

/// Moves `slot`, keys and all, from node `from` to node `to`, as `redis-cli --cluster
/// reshard` does, and tells every node: the new owner first, then the old, then the rest.
async fn move_slot(nodes: &mut [Node], slot: u16, from: usize, to: usize) -> Outcome {
    let (from_id, to_id) = (nodes[from].id.clone(), nodes[to].id.clone());
    let (to_host, to_port) = (nodes[to].host.clone(), nodes[to].port);
    let setslot = |state: &str, id: &str| {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id)
            .clone()
    };
    let _: () = setslot("IMPORTING", &from_id)
        .query_async(&mut nodes[to].conn)
        .await
        .map_err(fail("SETSLOT IMPORTING"))?;
    let _: () = setslot("MIGRATING", &to_id)
        .query_async(&mut nodes[from].conn)
        .await
        .map_err(fail("SETSLOT MIGRATING"))?;
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query_async(&mut nodes[from].conn)
            .await
            .map_err(fail("GETKEYSINSLOT"))?;
        if keys.is_empty() {
            break;
        }
        let _: () = redis::cmd("MIGRATE")
            .arg(&to_host)
            .arg(to_port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut nodes[from].conn)
            .await
            .map_err(fail("MIGRATE"))?;
    }
    let rest = (0..nodes.len()).filter(|i| *i != from && *i != to);
    for i in [to, from].into_iter().chain(rest) {
        let _: () = setslot("NODE", &to_id)
            .query_async(&mut nodes[i].conn)
            .await
            .map_err(fail("SETSLOT NODE"))?;
    }
    Ok(())
}
