//! A hundred waiters on one lock: each hand-off costs O(1) requests and wakes at most two
//! waiters, in FIFO order (no herd effect); the waiter right behind the holder takes the lock
//! when the holder's node goes without listing again, and the one behind it lists meanwhile.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_until, unique_name},
};
use lock_core::{Fence, LockClient, LockError, LockGuard, LockName, LockOptions};
use lock_zookeeper::{OpCounts, ZkBackend, ZkConfig};
use tokio::task::JoinHandle;

use super::{
    client, locked,
    support::{STANDALONE_VAR, ZkStore, hosts, raw_client},
    take_record_release,
};

const WAITERS: usize = 100;
const BACKENDS: usize = 10;

/// The requests all `clients` sent so far.
fn total(clients: &[(LockClient, ZkBackend)]) -> OpCounts {
    clients
        .iter()
        .map(|(_, backend)| backend.operations())
        .sum::<OpCounts>()
}

/// 100 waiters on one lock, from 10 clients: queueing costs each one create and list and three
/// watches (its own node, the contenders one and two before it); then each hand-off costs the
/// holder's delete and at most one listing (by the waiter two behind the holder), and the
/// waiters are served in queue (fence) order.
pub(crate) async fn no_herd() -> Outcome {
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let config = ZkConfig::new(hosts).session_timeout(Duration::from_secs(10));
    let mut clients = Vec::new();
    for _ in 0..BACKENDS {
        clients.push(client(&config).await?);
    }
    let name = unique_name("herd")?;
    // No watchdog: only the recipe's own requests are counted.
    let options = LockOptions::new()
        .wait(Duration::from_secs(120))
        .watchdog(false);
    let first = clients[0].0.lock_with(&name, &options).await.map_err(err)?;
    let before_queue = total(&clients);
    let acquired: Arc<Mutex<Vec<Fence>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..WAITERS {
        let client = clients[i % BACKENDS].0.clone();
        tasks.spawn(take_record_release(
            i,
            client,
            name.clone(),
            options.clone(),
            acquired.clone(),
        ));
    }
    // Queued: every waiter created its node, listed, and set its watches: of its own node, the
    // contender just before it and the one two before (the first waiter has none two before).
    let watches = 3 * WAITERS as u64 - 1;
    poll_until(
        Duration::from_secs(30),
        "100 waiters watching",
        async || Ok(total(&clients).watches - before_queue.watches >= watches),
    )
    .await?;
    let queued = total(&clients);
    ensure!(
        queued.creates - before_queue.creates == WAITERS as u64
            && queued.lists - before_queue.lists == WAITERS as u64
            && queued.watches - before_queue.watches == watches,
        "queueing 100 waiters took {queued:?} (from {before_queue:?}); expected one create and \
         list each and {watches} watches"
    );
    ensure!(locked(&acquired).is_empty(), "a waiter got the held lock");
    let start = Instant::now();
    first.release().await.map_err(err)?;
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(err)??;
    }
    let took = start.elapsed();
    let fences = locked(&acquired).clone();
    handoffs_cost_one_each(&queued, &total(&clients), &fences, took)
}

/// The hand-offs from `queued` to `after`: in queue (fence) order, at most one listing each
/// (a release woke at most two waiters, one of which lists), two requests each at most.
fn handoffs_cost_one_each(
    queued: &OpCounts,
    after: &OpCounts,
    fences: &[Fence],
    took: Duration,
) -> Outcome {
    let handoffs = WAITERS as u64;
    let spent = after.total() - queued.total();
    let lists = after.lists - queued.lists;
    ensure!(
        fences.len() == WAITERS && fences.windows(2).all(|w| w[0] < w[1]),
        "waiters were not served in queue (fence) order"
    );
    // Each hand-off: the holder's delete and at most one listing, by the waiter two behind the
    // holder (none for the last, which has nobody two behind it; the waiter just behind takes
    // the lock without listing, see `third_in_line_lists_before_its_turn`).
    ensure!(
        handoffs - 1 <= lists && lists <= handoffs,
        "{lists} listings for {handoffs} hand-offs: expected one each (a release wakes at most \
         two waiters, and one of them lists) but for the last"
    );
    ensure!(
        spent <= 2 * handoffs + 1,
        "{spent} requests for {handoffs} hand-offs ({:?} -> {after:?}); expected 2 each",
        queued
    );
    println!(
        "        {handoffs} hand-offs in {took:?}: {spent} requests ({lists} lists, {} deletes), {:.2} per hand-off",
        after.deletes - queued.deletes,
        spent as f64 / handoffs as f64
    );
    Ok(())
}

/// One holder, one waiter right behind it: when the holder's node goes, the waiter holds the
/// lock without listing the contenders again (nodes below the holder's cannot appear: their
/// sequence numbers would be lower): a round trip fewer per hand-off (it watches its own node
/// beside the holder's instead).
pub(crate) async fn second_in_line_needs_no_listing() -> Outcome {
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let config = ZkConfig::new(hosts).session_timeout(Duration::from_secs(10));
    let (holder, _) = client(&config).await?;
    let (waiter, waiter_backend) = client(&config).await?;
    let name = unique_name("second")?;
    let options = LockOptions::new()
        .wait(Duration::from_secs(30))
        .watchdog(false);
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let before = waiter_backend.operations();
    let waiting = {
        let (waiter, name, options) = (waiter.clone(), name.clone(), options.clone());
        tokio::spawn(async move { waiter.lock_with(&name, &options).await })
    };
    poll_until(Duration::from_secs(10), "the waiter watching", async || {
        Ok(waiter_backend.operations().watches > before.watches)
    })
    .await?;
    let queued = waiter_backend.operations();
    held.release().await.map_err(err)?;
    let guard = waiting.await.map_err(err)?.map_err(err)?;
    let after = waiter_backend.operations();
    ensure!(
        after.lists == queued.lists,
        "the waiter right behind the holder listed {} more time(s) to take the lock ({queued:?} -> {after:?})",
        after.lists - queued.lists
    );
    is_holder(&waiter, &name, &guard, "the waiter").await?;
    guard.release().await.map_err(err)?;
    Ok(())
}

/// The holder, a waiter right behind it and one behind that: when the holder's node goes, the
/// third lists the contenders while the second holds the lock (it watches the contender two
/// before its own), so when the second's node goes the third holds the lock without listing
/// again: in a queue served in order, no listing is on a hand-off's path.
pub(crate) async fn third_in_line_lists_before_its_turn() -> Outcome {
    let ThreeInLine {
        config,
        name,
        held,
        second: (second, second_backend),
        third: (third, third_backend),
        spawn,
    } = three_in_line("third").await?;
    let second_waits = spawn(second.clone());
    poll_until(Duration::from_secs(10), "the second watching", async || {
        Ok(second_backend.operations().watches > 0)
    })
    .await?;
    let third_waits = spawn(third.clone());
    poll_until(Duration::from_secs(10), "the third watching", async || {
        Ok(third_backend.operations().watches > 0)
    })
    .await?;
    let queued = third_backend.operations();
    held.release().await.map_err(err)?;
    let second_holds = second_waits.await.map_err(err)?.map_err(err)?;
    poll_until(
        Duration::from_secs(10),
        "the third in line listing the contenders once the holder's node went",
        async || Ok(third_backend.operations().lists > queued.lists),
    )
    .await?;
    // A session answers in order: once a sync sent after the third's listing is answered, so
    // is the listing, and the third knows it is right behind the second before that releases
    // (else it could take the lock from a listing sent after the release, listing no more).
    third_backend
        .zookeeper()
        .await
        .map_err(err)?
        .sync(&config.lock_path(&name))
        .await
        .map_err(err)?;
    let listed = third_backend.operations();
    ensure!(
        !third_waits.is_finished(),
        "the third contender got the lock while the second holds it"
    );
    let fence = second_holds.fence();
    second_holds.release().await.map_err(err)?;
    let third_holds = third_waits.await.map_err(err)?.map_err(err)?;
    let after = third_backend.operations();
    ensure!(
        after.lists == listed.lists,
        "the third in line listed {} more time(s) after the second's release to take the lock \
         ({queued:?} -> {listed:?} -> {after:?})",
        after.lists - listed.lists
    );
    ensure!(
        third_holds.fence() > fence,
        "the third contender's fence {} is not above the second's {fence}",
        third_holds.fence()
    );
    is_holder(&third, &name, &third_holds, "the third contender").await?;
    third_holds.release().await.map_err(err)?;
    Ok(())
}

/// Fails unless the lock `name`, as `client` inspects it, is held with `guard`'s fence (`who`
/// names the guard's owner in the failure).
async fn is_holder(client: &LockClient, name: &LockName, guard: &LockGuard, who: &str) -> Outcome {
    let fence = client
        .inspect(name)
        .await
        .map_err(err)?
        .map(|info| info.fence);
    ensure!(
        fence == Some(guard.fence()),
        "{who}'s grant (fence {}) is not the lock's holder (fence {fence:?})",
        guard.fence()
    );
    Ok(())
}

/// Three clients of one lock on the standalone server (10 s sessions), the first holding it,
/// and how the other two wait for it (a 30 s budget; no watchdog, so only the recipe's own
/// requests are counted).
struct ThreeInLine {
    config: ZkConfig,
    name: LockName,
    held: LockGuard,
    second: (LockClient, ZkBackend),
    third: (LockClient, ZkBackend),
    spawn: Box<dyn Fn(LockClient) -> JoinHandle<Result<LockGuard, LockError>>>,
}

/// A [`ThreeInLine`] on a lock named after `prefix`.
async fn three_in_line(prefix: &str) -> Result<ThreeInLine, Failure> {
    let config = ZkConfig::new(hosts(STANDALONE_VAR).map_err(Failure)?)
        .session_timeout(Duration::from_secs(10));
    let (holder, _) = client(&config).await?;
    let second = client(&config).await?;
    let third = client(&config).await?;
    let name = unique_name(prefix)?;
    let options = LockOptions::new()
        .wait(Duration::from_secs(30))
        .watchdog(false);
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let spawn = {
        let name = name.clone();
        Box::new(move |client: LockClient| {
            let (name, options) = (name.clone(), options.clone());
            tokio::spawn(async move { client.lock_with(&name, &options).await })
        })
    };
    Ok(ThreeInLine {
        config,
        name,
        held,
        second,
        third,
        spawn,
    })
}

/// The sequence number at the end of a contender node's name.
fn sequence(node: &str) -> u64 {
    node.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

/// A waiter right behind the holder whose own node someone else deleted does not take the
/// lock when the holder goes: its own node's watch fires, it lists and queues again behind the
/// waiter that was behind it, which holds the lock meanwhile.
pub(crate) async fn second_in_line_whose_node_went_queues_again() -> Outcome {
    let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(10))
        .await
        .map_err(Failure)?;
    let admin = raw_client(
        &hosts(STANDALONE_VAR).map_err(Failure)?,
        Duration::from_secs(10),
    )
    .await
    .map_err(Failure)?;
    let ThreeInLine {
        config,
        name,
        held,
        second: (second, _),
        third: (third, _),
        spawn,
    } = three_in_line("second-gone").await?;
    let contenders = async |n: usize| {
        poll_until(
            Duration::from_secs(10),
            &format!("{n} contenders"),
            async || Ok(store.children(&name).await.map_err(err)?.len() == n),
        )
        .await
    };
    let second_waits = spawn(second.clone());
    contenders(2).await?;
    let third_waits = spawn(third.clone());
    contenders(3).await?;
    let mut nodes = store.children(&name).await.map_err(err)?;
    nodes.sort_by_key(|node| sequence(node));
    let seconds = nodes
        .get(1)
        .ok_or_else(|| Failure(format!("no second contender in {nodes:?}")))?;
    let lock_path = config.lock_path(&name);
    admin
        .delete(&format!("{lock_path}/{seconds}"), None)
        .await
        .map_err(|e| Failure(format!("deleting the second contender's node: {e}")))?;
    held.release().await.map_err(err)?;
    let third_holds = third_waits.await.map_err(err)?.map_err(err)?;
    // The second contender queued again: a node of its own behind the third's, the holder's.
    poll_until(
        Duration::from_secs(10),
        "the second contender queued again behind the holder",
        async || Ok(store.children(&name).await.map_err(err)?.len() == 2),
    )
    .await?;
    ensure!(
        !second_waits.is_finished(),
        "the second contender, whose node was deleted, got the lock while the third holds it"
    );
    let fence = third_holds.fence();
    third_holds.release().await.map_err(err)?;
    let second_holds = second_waits.await.map_err(err)?.map_err(err)?;
    ensure!(
        second_holds.fence() > fence,
        "the second contender's fence {} is not above the third's {fence}",
        second_holds.fence()
    );
    second_holds.release().await.map_err(err)?;
    Ok(())
}
