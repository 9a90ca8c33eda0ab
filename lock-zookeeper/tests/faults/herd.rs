//! A hundred waiters on one lock: each hand-off costs O(1) requests and wakes exactly one
//! waiter, in FIFO order (no herd effect); and the waiter right behind the holder takes the
//! lock when the holder's node goes without listing again.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_until, unique_name},
};
use lock_core::{Fence, LockClient, LockOptions};
use lock_zookeeper::{OpCounts, ZkBackend, ZkConfig};

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

/// 100 waiters on one lock, from 10 clients: queueing costs each one create, list and watch;
/// then each hand-off costs the holder's delete and at most the next waiter's one listing,
/// and the waiters are served in queue (fence) order.
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
    // Queued: every waiter created its node, listed, and set its one watch.
    poll_until(
        Duration::from_secs(30),
        "100 waiters watching",
        // One watch each, and the first also watches its own node.
        async || Ok(total(&clients).watches - before_queue.watches > WAITERS as u64),
    )
    .await?;
    let queued = total(&clients);
    ensure!(
        queued.creates - before_queue.creates == WAITERS as u64
            && queued.lists - before_queue.lists == WAITERS as u64,
        "queueing 100 waiters took {queued:?} (from {before_queue:?}); expected one create, list and watch each"
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
/// (a release woke one waiter), two requests each at most.
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
    // Each hand-off: the holder's delete and at most the next waiter's one listing (none for
    // the waiter right behind the first holder, see `second_in_line_needs_no_listing`).
    ensure!(
        handoffs - 1 <= lists && lists <= handoffs,
        "{lists} listings for {handoffs} hand-offs: expected one each (a release wakes one \
         waiter) but for the waiter right behind the first holder"
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
    ensure!(
        waiter
            .inspect(&name)
            .await
            .map_err(err)?
            .map(|info| info.fence)
            == Some(guard.fence()),
        "the waiter's grant is not the lock's holder"
    );
    guard.release().await.map_err(err)?;
    Ok(())
}

/// The sequence number at the end of a contender node's name.
fn sequence(node: &str) -> u64 {
    node.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

/// A waiter right behind the holder whose own node someone else deleted does not take the
/// lock when the holder goes (nor does it skip its listing): it queues again behind the waiter
/// that was behind it, which holds the lock meanwhile.
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
    let config = ZkConfig::new(hosts(STANDALONE_VAR).map_err(Failure)?)
        .session_timeout(Duration::from_secs(10));
    let (holder, _) = client(&config).await?;
    let (second, _) = client(&config).await?;
    let (third, _) = client(&config).await?;
    let name = unique_name("second-gone")?;
    let options = LockOptions::new()
        .wait(Duration::from_secs(30))
        .watchdog(false);
    let held = holder.lock_with(&name, &options).await.map_err(err)?;
    let spawn = |client: LockClient| {
        let (name, options) = (name.clone(), options.clone());
        tokio::spawn(async move { client.lock_with(&name, &options).await })
    };
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
