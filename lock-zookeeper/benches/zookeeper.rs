//! Benchmark (not a test): the ZooKeeper backend against the raw floor measured in the same
//! run, on the standalone server and on the 3-node ensemble.
//!
//! - uncontended acquire + release cycle vs the raw floor: `create` + `delete` of an
//!   EPHEMERAL_SEQUENTIAL node with the same session (target <= 1.25x, at least 0.8x of the
//!   raw rate, although an acquisition needs a `create` and a `getChildren` and the floor
//!   does not list);
//! - 16 tasks (16 sessions) on one lock: hand-off latency (release start to the next holder's
//!   `acquire` returning) p50/p99 vs one raw `create` (target p50 <= 3x), and acquisitions per
//!   second;
//! - separate clients on one lock (`conformance_tests::bench::fleet_report`);
//! - the peer, zookeeper-client's own lock recipe, through the same workloads: its
//!   uncontended cycle against the same floor (right after ours), its separate clients (each
//!   of its runs right before ours of the same shape,
//!   `conformance_tests::bench::fleet_report_beside`) and its client sweep (before ours);
//! - the client sweep on many names (`conformance_tests::bench::sweep_report`);
//! - the renewal cost of 10,000 locks held by one client (`conformance_tests::bench::renewal_report`).
//!
//! Run with `cargo bench -p lock-zookeeper` (servers from `cargo xtask services up`, variables
//! from `cargo xtask services env`). `LOCK_BENCH_N` sets the number of cycles (default 1000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::{process::ExitCode, time::Duration};

use conformance_tests::bench::{self, Report, Stats};
use lock_core::{LockClient, LockOptions};
use lock_zookeeper::{ZkBackend, ZkConfig};
use zookeeper_client::{Acls, Client, CreateMode, LockPrefix};

const TASKS: usize = 16;

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// The raw floor's node prefix under a container of its own, next to the locks, and the path
/// of a persistent node that keeps that container while the floor runs: the server deletes a
/// container found empty (its check runs every minute by default), and the floor empties it
/// after every `delete`, so without the keeper a `create` may find no parent (`NoNode`, which
/// failed a run here). Deleting the keeper afterwards lets the server take the container.
async fn floor_prefix(raw: &Client, config: &ZkConfig) -> Result<(String, String), String> {
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    raw.mkdir(&config.root, &persistent).await.map_err(text)?;
    let dir = format!("{}/bench-floor-{:016x}", config.root, rand::random::<u64>());
    let container = CreateMode::Container.with_acls(Acls::anyone_all());
    raw.create(&dir, &[], &container).await.map_err(text)?;
    let keeper = format!("{dir}/keeper");
    raw.create(&keeper, &[], &persistent).await.map_err(text)?;
    Ok((
        format!("{dir}/_c_00000000-0000-4000-8000-000000000000-lock-"),
        keeper,
    ))
}

const DATA: &[u8] = b"0123456789abcdef0123456789abcdef";

async fn raw_create(raw: &Client, prefix: &str) -> Result<String, String> {
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, sequence) = raw.create(prefix, DATA, &options).await.map_err(text)?;
    Ok(format!("{prefix}{sequence}"))
}

/// How long each run of separate clients lasts.
const FLEET_TIME: Duration = Duration::from_secs(3);

/// How long each step of the client sweep lasts.
const SWEEP_TIME: Duration = Duration::from_secs(1);

/// The peer beside ours: the lock recipe of `zookeeper-client` (the client crate this
/// backend uses), Curator's node layout, a session per client; released by dropping its
/// guard, which deletes the node in the background, as its docs show.
const PEER: &str = "zookeeper-client 0.11 lock recipe";

/// One client of the peer: its session, and the node under which each lock's directory is.
struct Recipe {
    client: Client,
    dir: String,
}

impl bench::Contender for Recipe {
    async fn turn(
        &self,
        name: &lock_core::LockName,
        end: std::time::Instant,
        hold: Duration,
    ) -> bench::Turn {
        let dir = format!("{}/{name}", self.dir);
        let acquire = async {
            let prefix = LockPrefix::new_curator(&dir, "lock-").map_err(text)?;
            // The lock's directory and its parents are containers made when missing, as
            // Curator's `creatingParentContainersIfNeeded` does: the server deletes a container
            // once its last child is gone (the peer's guards delete their nodes in the
            // background, and a client's runtime may end first: then its session's end
            // takes the node).
            let container = CreateMode::Container.with_acls(Acls::anyone_all());
            let options = zookeeper_client::LockOptions::new(Acls::anyone_all())
                .with_ancestor_options(container)
                .map_err(text)?;
            self.client.lock(prefix, b"", options).await.map_err(text)
        };
        // Dropping the guard deletes the node in the background, as the recipe's docs show.
        bench::peer_turn(end, hold, acquire, |guard| async move {
            drop(guard);
            Ok(())
        })
        .await
    }
}

/// How each client of the peer connects to the servers of `var`: a session of its own, its
/// locks under a node of this run (`config`'s root, a name of its own).
fn peer_connect(
    config: &ZkConfig,
    var: &str,
) -> Result<impl Fn() -> Connecting + Clone + Send + Sync + 'static, String> {
    let hosts = support::hosts(var)?;
    let dir = format!("{}/bench-peer-{:016x}", config.root, rand::random::<u64>());
    Ok(move || {
        let (hosts, dir) = (hosts.clone(), dir.clone());
        Box::pin(async move {
            Ok(Recipe {
                client: Client::connect(&hosts).await.map_err(text)?,
                dir,
            })
        }) as Connecting
    })
}

/// A peer's client connecting.
type Connecting = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Recipe, String>>>>;

/// The peer's uncontended cycle, `n` cycles timed as ours are (right after ours), against the
/// same raw `floor`; a line with the error when it fails. Its release drops the guard, which
/// deletes the node in the background (as the recipe's docs show): a cycle does not wait for
/// that delete, which ours does.
async fn peer_uncontended(
    report: &mut Report,
    connect: impl Fn() -> Connecting,
    floor: &Stats,
    n: usize,
) {
    let metric = format!("{PEER}: {CYCLE_FLOOR}");
    match bench::peer_uncontended(connect(), n).await {
        Ok(cycle) => {
            report.stats(&format!("{PEER}: acquire + release"), &cycle);
            report.ratio(&metric, cycle.mean, floor.mean, None);
        }
        Err(error) => report.failed(&metric, &error),
    }
}

/// The metric of the uncontended cycle against the raw floor, by their means.
const CYCLE_FLOOR: &str = "cycle / floor, mean";

async fn run(label: &str, var: &str, n: usize) -> Result<(), String> {
    let config = ZkConfig::new(support::hosts(var)?).session_timeout(Duration::from_secs(10));
    let backend = ZkBackend::connect(config.clone()).await.map_err(text)?;
    let client = LockClient::new(backend.clone());
    // The same session the backend uses.
    let raw = backend.zookeeper().await.map_err(text)?;
    let (prefix, keeper) = floor_prefix(&raw, &config).await?;
    let (raw, prefix) = (&raw, prefix.as_str());

    let floor = bench::time_op(n, || async move {
        let path = raw_create(raw, prefix).await?;
        raw.delete(&path, None).await.map_err(text)
    })
    .await?;
    let created = std::sync::Mutex::new(Vec::with_capacity(
        (n + n / 10) * (1 + bench::STEADY_ROUNDS),
    ));
    let create_one = || async {
        let path = raw_create(raw, prefix).await?;
        created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(path);
        Ok(())
    };
    let create = bench::time_op(n, create_one).await?;
    // The fleets' floor (see `bench::steady_p50`).
    let steady_create = bench::steady_p50(n, create_one).await?;
    let created = created
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    futures::future::try_join_all(created.iter().map(|path| raw.delete(path, None)))
        .await
        .map_err(text)?;
    raw.delete(&keeper, None).await.map_err(text)?;

    let mut report = Report::new(label);
    let peer = peer_connect(&config, var)?;
    if conformance_tests::selection::workload(conformance_tests::selection::UNCONTENDED) {
        one_client(&mut report, &client, &config, &floor, &create, n).await?;
        peer_uncontended(&mut report, peer.clone(), &floor, n).await;
    }
    bench::fleet_report_beside(
        &mut report,
        bench::each_own(config.clone(), ZkBackend::connect),
        (PEER, peer.clone()),
        steady_create,
        FLEET_TIME,
        &Counters {
            hosts: support::hosts(var)?,
            count: Count::Requests,
        },
    )
    .await?;
    bench::peer_sweep_report(&mut report, PEER, peer, SWEEP_TIME, support::instances(var)).await;
    bench::sweep_report(
        &mut report,
        bench::each_own(config, ZkBackend::connect),
        SWEEP_TIME,
        support::instances(var),
    )
    .await?;
    bench::renewal_report(
        &mut report,
        &backend,
        &Counters {
            hosts: support::hosts(var)?,
            count: Count::Packets,
        },
        bench::RENEWAL_LOCKS,
        support::instances(var),
    )
    .await?;
    report.finish().map_err(text)
}

/// The workload of one client: its uncontended cycle and the hand-off between tasks of
/// clients on one lock, against the raw floor (`floor`) and one raw create (`create`).
async fn one_client(
    report: &mut Report,
    client: &LockClient,
    config: &ZkConfig,
    floor: &Stats,
    create: &Stats,
    n: usize,
) -> Result<(), String> {
    let options = LockOptions::new().wait(Duration::from_secs(60));
    let cycle = bench::uncontended(client, &options, n).await?;

    let mut clients = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        clients.push(LockClient::new(
            ZkBackend::connect(config.clone()).await.map_err(text)?,
        ));
    }
    let contended = bench::contended(&clients, &options, TASKS, n).await?;

    report.stats("raw create + delete (floor)", floor);
    report.stats("raw create", create);
    report.stats("acquire + release", &cycle);
    // At least 0.8x of the raw rate.
    report.ratio("cycle / floor, p50", cycle.p50, floor.p50, Some(1.25));
    report.ratio(CYCLE_FLOOR, cycle.mean, floor.mean, Some(1.25));
    report.stats(&format!("hand-off, {TASKS} tasks"), &contended.handoff);
    report.ratio(
        "hand-off p50 / raw create p50",
        contended.handoff.p50,
        create.p50,
        Some(3.0),
    );
    report.ratio(
        "hand-off p99 / raw create p99",
        contended.handoff.p99,
        create.p99,
        None,
    );
    report.rate(
        &format!("acquisitions per second, {TASKS} tasks"),
        contended.per_second,
    );
    report.rate("raw create + delete per second", per_second(floor));
    Ok(())
}

/// What [`Counters`] counts as one operation.
#[derive(Clone, Copy)]
enum Count {
    /// Every packet received: requests, and each session's pings. The renewal report's count:
    /// a ZooKeeper session keeps its locks by those pings; and the requests alone would get a
    /// renewal batch wrong (its `sync` is not counted, its `multiRead` counts once per node).
    Packets,
    /// The requests that change or read the tree: the writes each server took from its own
    /// sessions (`zk_cnt_updatelatency`: every request with a transaction, a create or delete
    /// that failed too, sessions' creation and close) and the reads it served of a node that
    /// exists under a path (`zk_cnt_<first path part>_read_per_namespace`: `getData`,
    /// `exists`, `getChildren`). Not counted: pings, `sync`, the watch calls (`setWatches`,
    /// `checkWatches`, `removeWatches`) and reads answered "no node" (ZooKeeper 3.8's
    /// `FinalRequestProcessor`, `ServerStats`, `DataTree.updateReadStat`; the per-namespace
    /// lines exist from 3.6 on, and on a server only once it served such a read: before, the
    /// count is the writes alone). The fleets' count of operations per hand-off: an idle session
    /// pings every few seconds whatever the lock does, so with 1,000 waiting clients the pings,
    /// not the lock, grew the count per hand-off (see the CHANGELOG); a steady hand-off's
    /// create, lists, watches set on existing nodes and delete are all counted.
    Requests,
}

/// The servers' own counts, from the `mntr` command, summed over the servers of `hosts`: live
/// connections, and operations counted as `count` says.
struct Counters {
    hosts: String,
    count: Count,
}

impl Counters {
    /// Each server's `mntr` answer.
    async fn mntr(&self) -> Result<Vec<(String, String)>, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut answers = Vec::new();
        for host in self.hosts.split(',') {
            let mut stream = tokio::net::TcpStream::connect(host).await.map_err(text)?;
            stream.write_all(b"mntr").await.map_err(text)?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.map_err(text)?;
            answers.push((host.to_owned(), answer));
        }
        Ok(answers)
    }

    async fn sum(&self, key: &str) -> Result<u64, String> {
        let mut sum = 0;
        for (host, answer) in self.mntr().await? {
            sum += bench::stat_line(&answer, key)
                .ok_or_else(|| format!("{host}: mntr has no {key}"))?;
        }
        Ok(sum)
    }

    /// The requests the servers served (see [`Count::Requests`]).
    async fn requests(&self) -> Result<u64, String> {
        let mut sum = 0;
        for (host, answer) in self.mntr().await? {
            sum += bench::stat_line(&answer, "zk_cnt_updatelatency")
                .ok_or_else(|| format!("{host}: mntr has no zk_cnt_updatelatency"))?;
            sum += bench::stat_sum(&answer, "zk_cnt_", "_read_per_namespace");
        }
        Ok(sum)
    }
}

impl bench::ServerCounters for Counters {
    fn operations_are(&self) -> &'static str {
        match self.count {
            Count::Packets => "packets (requests and pings)",
            Count::Requests => "requests (writes and reads of existing nodes)",
        }
    }

    async fn operations(&self) -> Result<u64, String> {
        match self.count {
            Count::Packets => self.sum("zk_packets_received").await,
            Count::Requests => self.requests().await,
        }
    }

    async fn sessions(&self) -> Result<u64, String> {
        self.sum("zk_num_alive_connections").await
    }
}

fn per_second(stats: &Stats) -> f64 {
    1.0 / stats.mean.as_secs_f64().max(f64::MIN_POSITIVE)
}

fn main() -> ExitCode {
    let n = std::env::var("LOCK_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    conformance_tests::main_with(async move {
        let mut failed = Vec::new();
        for (label, var) in [
            ("zookeeper", support::STANDALONE_VAR),
            ("zookeeper-ensemble(3)", support::ENSEMBLE_VAR),
        ] {
            if !conformance_tests::selection::selected(label) {
                continue;
            }
            if let Err(error) = run(label, var, n).await {
                eprintln!("{label}: benchmark failed: {error}");
                failed.push(label);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("benchmarks failed: {}", failed.join(", ")))
        }
    })
}
