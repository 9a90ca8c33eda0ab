//! A hundred waiters on one lock: each hand-off costs O(1) requests and wakes exactly one
//! waiter, in FIFO order (no herd effect).

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
    support::{STANDALONE_VAR, hosts},
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
/// then each hand-off costs the holder's delete and the next waiter's one listing, and the
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
    // Queued: every waiter created its node, listed, and set its one watch.
    poll_until(
        Duration::from_secs(30),
        "100 waiters watching",
        async || Ok(total(&clients).watches - before_queue.watches >= WAITERS as u64),
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

/// The hand-offs from `queued` to `after`: in queue (fence) order, one listing each (a
/// release woke one waiter), two requests each.
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
    // Each hand-off: the holder's delete and the next waiter's one listing.
    ensure!(
        lists == handoffs,
        "{lists} listings for {handoffs} hand-offs: a release woke more than one waiter"
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
