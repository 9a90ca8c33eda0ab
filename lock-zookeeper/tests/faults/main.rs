//! Faults specific to ZooKeeper, run one after another (they stop and pause servers):
//!
//! 1. `leader_killed`: the ensemble's leader is killed while a client connected to it holds a
//!    lock and others wait; the holder keeps the lock (its session moves to another server),
//!    the waiters proceed after release; the killed node is restarted.
//! 2. `server_paused`: the standalone server is paused (SIGSTOP) past the session timeout; the
//!    holder's `lost()` fires, and after SIGCONT a waiter gets the lock on a new session.
//! 3. `no_herd`: 100 waiters on one lock; each hand-off costs O(1) requests and wakes at most
//!    two waiters, in FIFO order; `second_in_line_needs_no_listing`: the waiter right behind the
//!    holder takes the lock when the holder's node goes, without listing again, unless
//!    someone deleted its own node meanwhile (`second_in_line_whose_node_went_queues_again`);
//!    `third_in_line_lists_before_its_turn`: the waiter behind that one lists while the second
//!    holds, so no listing is on a hand-off's path.
//! 4. `curator_interop`: contender nodes written in Curator's layout by a raw client are
//!    respected by this crate, and this crate's nodes are what Curator's algorithm expects.
//! 5. `lost_create_reply`: a relay drops the connection after the server applied the
//!    contender's `create` but before its reply reached the client; the contender finds its node
//!    again by UUID instead of creating a second one.
//! 6. `missing_root`: a lock root that does not exist yet is created, one node per segment,
//!    and every create the backend sends is counted.
//! 7. `follower_cut_off`: a follower cut off from the quorum confirms no renewal.
//! 8. `leader_touch_lag_left_out`: a lease granted or renewed on a follower leaves out the
//!    half tick the leader may learn of the session's touch late.
//!
//! Every fault is undone on every path (SIGCONT, restart), even when a case fails.
//! Arguments filter cases by substring. This file holds the `main` and what the cases share;
//! each topic has a file of its own, the servers' view (ports, modes) is in `servers.rs`, and
//! the wire frames in `tests/support/frames.rs`.

#[path = "../support/frames.rs"]
mod frames;
#[path = "../support/mod.rs"]
mod support;
#[path = "../support/trace.rs"]
mod trace;

mod curator;
mod ensemble;
mod herd;
mod lost_reply;
mod paused;
mod root;
mod servers;

use std::{
    process::ExitCode,
    sync::{Arc, Mutex},
};

use conformance_tests::{Cases, Failure, Outcome, faults::err};
use lock_core::{Fence, LockClient, LockError, LockName, LockOptions};
use lock_zookeeper::{ZkBackend, ZkConfig};

fn main() -> ExitCode {
    trace::install();
    Cases::<Failure>::new("faults")
        .case("leader_killed", || Box::pin(ensemble::leader_killed()))
        .case("server_paused", || Box::pin(paused::server_paused()))
        .case("no_herd", || Box::pin(herd::no_herd()))
        .case("second_in_line_needs_no_listing", || {
            Box::pin(herd::second_in_line_needs_no_listing())
        })
        .case("second_in_line_whose_node_went_queues_again", || {
            Box::pin(herd::second_in_line_whose_node_went_queues_again())
        })
        .case("third_in_line_lists_before_its_turn", || {
            Box::pin(herd::third_in_line_lists_before_its_turn())
        })
        .case("curator_interop", || Box::pin(curator::curator_interop()))
        .case("lost_create_reply", || {
            Box::pin(lost_reply::lost_create_reply())
        })
        .case("missing_root", || Box::pin(root::missing_root()))
        .case(
            "follower_cut_off",
            || Box::pin(ensemble::follower_cut_off()),
        )
        .case("leader_touch_lag_left_out", || {
            Box::pin(ensemble::leader_touch_lag_left_out())
        })
        .on_failure(|| {
            println!("        the last events before the failure:");
            for line in trace::last(400) {
                println!("        {line}");
            }
        })
        .main()
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waiter `i`: acquires, records its fence in `fences`, releases.
async fn take_record_release(
    i: usize,
    client: LockClient,
    name: LockName,
    options: LockOptions,
    fences: Arc<Mutex<Vec<Fence>>>,
) -> Outcome {
    let failed = |e: LockError| Failure(format!("waiter {i}: {e}"));
    let guard = client.lock_with(&name, &options).await.map_err(failed)?;
    locked(&fences).push(guard.fence());
    guard.release().await.map_err(failed)
}

async fn client(config: &ZkConfig) -> Result<(LockClient, ZkBackend), Failure> {
    let backend = ZkBackend::connect(config.clone()).await.map_err(err)?;
    Ok((LockClient::new(backend.clone()), backend))
}
