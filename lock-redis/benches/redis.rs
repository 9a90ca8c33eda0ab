//! Benchmark (not a test): the Redis backends against the raw floor measured in the same run.
//!
//! - uncontended acquire + release cycle vs the raw floor: `SET key token NX PX ttl` plus an
//!   `EVALSHA` compare-and-delete, on the same kind of connection, the two alternating op by op
//!   (target <= 1/0.95x: at least 0.95x of the raw rate);
//! - 16 tasks on one lock: hand-off latency (release start to next holder) p50/p99 vs one raw
//!   round trip (`SET NX PX`) (target p50 <= 3x), and acquisitions per second;
//! - renewing 50 held locks: one batched call vs 50 single renewals;
//! - separate clients (`conformance_tests::bench::fleet_report`); on the single server, their
//!   hand-off p50 also against the raw floor of a hand-off by push (a script's `PUBLISH` heard
//!   by another thread's client, see `push_floor`), and the 16 clients' rate against 16 raw
//!   clients passing the turn round-robin by push, measured before the fleets (no target, see
//!   `push_floor::ring`);
//! - the client sweep on many names (`conformance_tests::bench::sweep_report`);
//! - rslock, a peer library, on the single server, on the cluster (its cluster mode) and on
//!   the five Redlock servers, through the same workloads: its uncontended cycle against the same floor (right after ours),
//!   its separate clients (each of its runs right before ours of the same shape,
//!   `conformance_tests::bench::fleet_report_beside`) and its client sweep (before ours); each
//!   rslock client makes one throwaway acquisition before the clock starts, so its
//!   connections are up as ours are;
//! - the renewal cost of 10,000 locks held by one client
//!   (`conformance_tests::bench::renewal_report`), and rslock's, each lock extended on its own
//!   (`conformance_tests::bench::peer_renewal_report`).
//!
//! Run with `cargo bench -p lock-redis` (servers from `cargo xtask services up`); `cargo xtask
//! compare` runs it too.

use std::{future::Future, time::Duration};

#[path = "redis/push_floor.rs"]
mod push_floor;

use conformance_tests::{
    bench::{self, Report, Stats},
    selection,
};
use lock_core::{LockBackend, LockClient, LockName, LockOptions};
use lock_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use redis::{
    Script,
    aio::{ConnectionLike, ConnectionManager},
};

const TASKS: usize = 16;

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!(
            "{name} is not set; run `cargo xtask services up` and export `cargo xtask services env`"
        )
    })
}

async fn raw_connection(url: &str) -> Result<ConnectionManager, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    ConnectionManager::new(client)
        .await
        .map_err(|e| e.to_string())
}

/// The raw operations: `SET NX PX` then an `EVALSHA` compare-and-delete (the floor of a
/// cycle), or the `SET NX PX` alone (one raw round trip).
struct Raw<C> {
    conn: C,
    key: String,
    delete: Script,
}

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

impl<C: ConnectionLike + Clone + Send + Sync> Raw<C> {
    fn new(conn: C) -> Self {
        Self {
            conn,
            key: format!("bench:raw:{{{:016x}}}", rand::random::<u64>()),
            delete: Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            ),
        }
    }

    async fn set(&self) -> Result<(), String> {
        let _: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(TOKEN)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn cycle(&self) -> Result<(), String> {
        self.set().await?;
        let _: i64 = self
            .delete
            .key(&self.key)
            .arg(TOKEN)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn round_trip(&self) -> Result<Stats, String> {
        let stats = bench::time_op(PER_ROUND, || self.set()).await?;
        self.delete_key().await?;
        Ok(stats)
    }

    /// The round trip's p50 taken as the fleets' floor (see [`bench::steady_p50`]).
    async fn steady_round_trip(&self) -> Result<Duration, String> {
        let p50 = bench::steady_p50(PER_ROUND, || self.set()).await?;
        self.delete_key().await?;
        Ok(p50)
    }

    async fn delete_key(&self) -> Result<(), String> {
        let _: i64 = redis::cmd("DEL")
            .arg(&self.key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// rslock, a peer library, taking its turns as its README shows: `acquire` (which retries
/// until it has the lock, after a random delay of up to 200 ms between tries), hold, `release`.
struct Rslock {
    manager: rslock::LockManager,
}

impl bench::Contender for Rslock {
    async fn turn(&self, name: &LockName, end: std::time::Instant, hold: Duration) -> bench::Turn {
        let resource = format!("bench:rslock:{name}");
        let acquire = async {
            self.manager
                .acquire(resource.as_bytes(), Duration::from_secs(30))
                .await
                .map_err(|e| e.to_string())
        };
        // rslock's release answers nothing: a failed one shows only as a later wait.
        bench::peer_turn(end, hold, acquire, |guard| async move {
            guard.release().await;
            Ok(())
        })
        .await
    }
}

/// The servers' own counts: commands processed (`total_commands_processed`, which counts a
/// script's call and every command the script runs: on one server, 265,686 against a sum of
/// 265,700 calls in its `INFO commandstats`, scripts' commands included) and clients connected,
/// summed over the servers.
struct Counters {
    servers: Vec<ConnectionManager>,
}

impl Counters {
    async fn new(urls: &[String]) -> Result<Self, String> {
        let mut servers = Vec::with_capacity(urls.len());
        for url in urls {
            servers.push(raw_connection(url).await?);
        }
        Ok(Self { servers })
    }

    async fn sum(&self, section: &str, key: &str) -> Result<u64, String> {
        let mut sum = 0;
        for server in &self.servers {
            let info: String = redis::cmd("INFO")
                .arg(section)
                .query_async(&mut server.clone())
                .await
                .map_err(|e| e.to_string())?;
            sum += bench::stat_line(&info, key).ok_or_else(|| format!("INFO has no {key}"))?;
        }
        Ok(sum)
    }
}

impl bench::ServerCounters for Counters {
    fn operations_are(&self) -> &'static str {
        "commands"
    }

    async fn operations(&self) -> Result<u64, String> {
        self.sum("stats", "total_commands_processed").await
    }

    async fn sessions(&self) -> Result<u64, String> {
        self.sum("clients", "connected_clients").await
    }
}

/// The peer's name in the reports.
const RSLOCK: &str = "rslock 0.10";

/// A client of rslock on `urls` (one server, or Redlock's five; with `cluster`, a cluster's
/// seed nodes, in rslock's cluster mode, which counts the cluster as one server), connected:
/// rslock connects at its first call, so each client makes one throwaway acquisition (and
/// extension: each loads its script on first use) before the clock starts, as our clients
/// connect before it.
fn rslock_client(
    urls: &[String],
    cluster: bool,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<Rslock, String>>>>
+ Clone
+ Send
+ Sync
+ 'static {
    let urls = urls.to_vec();
    move || {
        let urls = urls.clone();
        Box::pin(async move {
            let manager = if cluster {
                rslock::LockManager::new_cluster(urls).map_err(|e| e.to_string())?
            } else {
                rslock::LockManager::new(urls)
            };
            let warm = format!("bench:rslock:warm:{:016x}", rand::random::<u64>());
            let guard = manager
                .lock(warm.as_bytes(), Duration::from_secs(1))
                .await
                .map_err(|e| e.to_string())?;
            // Its extend script too, so that no workload's first period loads it.
            let guard = manager
                .extend(&guard, Duration::from_secs(1))
                .await
                .map_err(|e| e.to_string())?;
            guard.release().await;
            Ok(Rslock { manager })
        })
    }
}

/// rslock's uncontended cycle on `urls` against `floor` (the floor ours was measured
/// against), reported as `metric` after the peer's name; a line with the error when it fails.
async fn rslock_uncontended<F, FF>(report: &mut Report, urls: &[String], floor: (F, &str))
where
    F: Fn() -> FF,
    FF: Future<Output = Result<(), String>>,
{
    rslock_uncontended_on(report, rslock_client(urls, false), floor).await;
}

/// [`rslock_uncontended`] with the client `connect` makes (on a cluster, say).
async fn rslock_uncontended_on<C, CF, F, FF>(
    report: &mut Report,
    connect: C,
    (floor, metric): (F, &str),
) where
    C: Fn() -> CF,
    CF: Future<Output = Result<Rslock, String>>,
    F: Fn() -> FF,
    FF: Future<Output = Result<(), String>>,
{
    let metric = format!("{RSLOCK}: {metric}");
    match bench::peer_uncontended_rounds(connect(), ROUNDS, PER_ROUND, floor).await {
        Ok(cycle) => report.round_ratio(&metric, &cycle, None),
        Err(error) => report.failed(&metric, &error),
    }
}

/// Rounds of each ratio (the harness takes a tenth in a quick run).
const ROUNDS: usize = 10;

/// Operations per round.
const PER_ROUND: usize = 200;

/// How long each run of separate clients lasts.
const FLEET_TIME: Duration = Duration::from_secs(3);

/// How long each step of the client sweep lasts.
const SWEEP_TIME: Duration = Duration::from_secs(1);

async fn lock_numbers<C: ConnectionLike + Clone + Send + Sync>(
    report: &mut Report,
    client: &LockClient,
    raw: &Raw<C>,
    targets: bool,
) -> Result<(), String> {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(30));
    let cycle =
        bench::uncontended_rounds(client, &options, ROUNDS, PER_ROUND, || raw.cycle()).await?;
    report.round_ratio(
        ONE_SERVER,
        &cycle,
        // At least 0.95x of the raw rate.
        targets.then_some(1.0 / 0.95),
    );
    let rates = std::sync::Mutex::new(Vec::new());
    let (rates_ref, options_ref) = (&rates, &options);
    let handoff = bench::round_ratios(ROUNDS, || async move {
        let rtt = raw.round_trip().await?;
        let contended =
            bench::contended(std::slice::from_ref(client), options_ref, TASKS, PER_ROUND).await?;
        rates_ref
            .lock()
            .map_err(|e| e.to_string())?
            .push(contended.per_second);
        Ok((contended.handoff.p50, rtt.p50))
    })
    .await?;
    report.round_ratio(
        "16-task hand-off p50 / raw round trip p50",
        &handoff,
        targets.then_some(3.0),
    );
    let mut rate = rates.into_inner().map_err(|e| e.to_string())?;
    rate.sort_by(f64::total_cmp);
    report.rate(
        "16-task acquisitions (median of rounds)",
        rate[rate.len() / 2],
    );
    Ok(())
}

/// 50 held locks renewed by one `renew_many` vs one `renew` each.
async fn batching(report: &mut Report, backend: &RedisBackend) -> Result<(), String> {
    let client = LockClient::new(backend.clone());
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .watchdog(false);
    let mut guards = Vec::new();
    for i in 0..50 {
        let name = LockName::new(format!("bench/batch/{i}/{:016x}", rand::random::<u64>()))
            .map_err(|e| e.to_string())?;
        guards.push(
            client
                .lock_with(&name, &options)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let leases: Vec<_> = guards.iter().map(|g| g.lease()).collect();
    let batched = bench::time_op(100, || async {
        let results = backend
            .renew_many(&leases)
            .await
            .map_err(|e| e.to_string())?;
        results
            .into_iter()
            .try_for_each(|r| r.map(drop))
            .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))
    })
    .await?;
    let one_by_one = bench::time_op(100, || async {
        for lease in &leases {
            backend
                .renew(lease, lease.ttl())
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })
    .await?;
    report.ratio(
        "renew 50 locks: one by one / batched",
        one_by_one.mean,
        batched.mean,
        None,
    );
    for guard in guards {
        guard.release().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// rslock's renewal cost on the servers of `instances`, with a client `connect` makes:
/// [`bench::RENEWAL_LOCKS`] locks taken with `lock`, each renewed with `extend` (rslock has no
/// batch: all of them at once, as a user would), released with `unlock`.
async fn rslock_renewal<C, CF>(
    report: &mut Report,
    connect: C,
    counters: &Counters,
    instances: &[&str],
) where
    C: Fn() -> CF,
    CF: Future<Output = Result<Rslock, String>>,
{
    const TTL: Duration = Duration::from_secs(60);
    if !selection::workload(selection::RENEWAL) {
        return;
    }
    let manager = match connect().await {
        Ok(client) => client.manager,
        Err(error) => {
            report.failed(&format!("{RSLOCK}: renewing held locks"), &error);
            return;
        }
    };
    let manager = &manager;
    let acquire = async |name: String| {
        let resource = format!("bench:rslock:{name}");
        manager
            .lock(resource.as_bytes(), TTL)
            .await
            .map_err(|e| e.to_string())
    };
    let renew = async |locks: &[rslock::Lock]| {
        let extended =
            futures::future::join_all(locks.iter().map(|lock| manager.extend(lock, TTL))).await;
        Ok(extended.iter().filter(|r| r.is_err()).count())
    };
    let release = async |locks: &[rslock::Lock]| {
        futures::future::join_all(locks.iter().map(|lock| manager.unlock(lock))).await;
    };
    bench::peer_renewal_report(
        report,
        (RSLOCK, counters),
        bench::RENEWAL_LOCKS,
        instances,
        (acquire, renew, release),
    )
    .await;
}

/// The workloads of many names: the client sweep (clients from `connect`) and the renewal of
/// 10,000 locks held through `backend`, on the servers of `instances`.
async fn many_names<C, CF, B>(
    report: &mut Report,
    connect: C,
    backend: &B,
    counters: &Counters,
    instances: &'static [&'static str],
) -> Result<(), String>
where
    C: Fn() -> CF + Clone + Send + Sync + 'static,
    CF: Future<Output = Result<LockClient, String>>,
    B: LockBackend,
{
    bench::sweep_report(report, connect, SWEEP_TIME, instances).await?;
    bench::renewal_report(report, backend, counters, bench::RENEWAL_LOCKS, instances).await
}

async fn run() -> Result<(), String> {
    let url = var("LOCK_TEST_REDIS_URL")?;
    // The single server's floor is Redlock's too (one of its five servers).
    let raw = Raw::new(raw_connection(&url).await?);
    if selection::selected("redis") {
        single(&url, &raw).await?;
    }
    if selection::selected("redis-cluster") {
        cluster().await?;
    }
    if selection::selected("redlock(5)") {
        redlock(&raw).await?;
    }
    Ok(())
}

async fn single(url: &str, raw: &Raw<ConnectionManager>) -> Result<(), String> {
    let counters = Counters::new(&[url.to_owned()]).await?;
    let mut report = Report::new("redis");
    let backend = RedisBackend::connect(RedisConfig::single(url).key_prefix("bench"))
        .await
        .map_err(|e| e.to_string())?;
    let urls = [url.to_owned()];
    if selection::workload(selection::UNCONTENDED) {
        lock_numbers(&mut report, &LockClient::new(backend.clone()), raw, true).await?;
        rslock_uncontended(&mut report, &urls, (|| raw.cycle(), ONE_SERVER)).await;
        batching(&mut report, &backend).await?;
    }
    let rtt = raw.steady_round_trip().await?;
    let ring = ring(url).await?;
    let fleets = bench::fleet_report_beside(
        &mut report,
        bench::each_own(
            RedisConfig::single(url).key_prefix("bench"),
            RedisBackend::connect,
        ),
        (RSLOCK, rslock_client(&urls, false)),
        rtt,
        FLEET_TIME,
        &counters,
    )
    .await?;
    push_report(&mut report, url, &fleets, ring).await?;
    bench::peer_sweep_report(
        &mut report,
        RSLOCK,
        rslock_client(&urls, false),
        SWEEP_TIME,
        &["redis"],
    )
    .await;
    rslock_renewal(
        &mut report,
        rslock_client(&urls, false),
        &counters,
        &["redis"],
    )
    .await;
    many_names(
        &mut report,
        bench::each_own(
            RedisConfig::single(url).key_prefix("bench"),
            RedisBackend::connect,
        ),
        &backend,
        &counters,
        &["redis"],
    )
    .await?;
    report.finish().map_err(|e| e.to_string())
}

/// The fleets of `fleets` that held the lock 1 ms (those the hand-off targets are about).
fn held_1ms(fleets: &[bench::Fleet]) -> Vec<&bench::Fleet> {
    fleets
        .iter()
        .filter(|fleet| fleet.hold == Duration::from_millis(1))
        .collect()
}

/// The raw floor of a hand-off by push (see [`push_floor::push_floor`]), and the hand-off of
/// each fleet that held 1 ms against it (none when no fleet ran); the rate of the
/// [`RING_CLIENTS`] fleet against `ring`'s, when measured (see [`ring`]).
async fn push_report(
    report: &mut Report,
    url: &str,
    fleets: &[bench::Fleet],
    ring: Option<f64>,
) -> Result<(), String> {
    let held = held_1ms(fleets);
    if held.is_empty() {
        return Ok(());
    }
    let floor_url = url.to_owned();
    let floor = tokio::task::spawn_blocking(move || push_floor::push_floor(&floor_url))
        .await
        .map_err(|e| e.to_string())??;
    report.stats(
        "raw hand-off by push (a script's PUBLISH heard by another thread's client)",
        &floor,
    );
    for fleet in &held {
        report.ratio(
            &format!(
                "{} clients, hold 1ms: hand-off to another client p50 / raw hand-off by push p50",
                fleet.clients
            ),
            fleet.handoff.p50,
            floor.p50,
            None,
        );
    }
    // The rate of the fairest hand-off with nothing around it (no target): as many raw
    // clients passing the turn round-robin by push (see `ring`). A lock that hands over to the
    // client that waited longest pays this wake-up of another client at every turn; one whose
    // releaser takes the lock again at once does not.
    if let Some(ring) = ring {
        for fleet in held
            .into_iter()
            .filter(|fleet| fleet.clients == RING_CLIENTS)
        {
            report.rate(
                &format!(
                    "{RING_CLIENTS} raw clients passing the turn round-robin by push, hold 1ms: \
                     acquisitions"
                ),
                ring,
            );
            let per = |rate: f64| Duration::from_secs_f64(1.0 / rate.max(f64::MIN_POSITIVE));
            report.ratio(
                &format!(
                    "{RING_CLIENTS} clients, hold 1ms: time per acquisition / raw round-robin by push"
                ),
                per(fleet.per_second),
                per(ring),
                None,
            );
        }
    }
    Ok(())
}

/// The rate of [`push_floor::ring`] with [`RING_CLIENTS`] holding 1 ms, when that fleet runs
/// (measured before the fleets: after their 1,000-client runs the server may still be
/// recovering).
async fn ring(url: &str) -> Result<Option<f64>, String> {
    if !bench::chosen_runs().contains(&(RING_CLIENTS, Duration::from_millis(1))) {
        return Ok(None);
    }
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        push_floor::ring(&url, RING_CLIENTS, Duration::from_millis(1), FLEET_TIME)
    })
    .await
    .map_err(|e| e.to_string())?
    .map(Some)
}

/// The clients of the fleet compared with [`push_floor::ring`].
const RING_CLIENTS: usize = 16;

async fn cluster() -> Result<(), String> {
    let cluster_urls: Vec<String> = var("LOCK_TEST_REDIS_CLUSTER_URLS")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut report = Report::new("redis-cluster");
    let cluster_raw = redis::cluster::ClusterClient::new(cluster_urls.clone())
        .map_err(|e| e.to_string())?
        .get_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let backend =
        RedisBackend::connect(RedisConfig::cluster(cluster_urls.clone()).key_prefix("bench"))
            .await
            .map_err(|e| e.to_string())?;
    let cluster_raw = Raw::new(cluster_raw);
    if selection::workload(selection::UNCONTENDED) {
        lock_numbers(
            &mut report,
            &LockClient::new(backend.clone()),
            &cluster_raw,
            true,
        )
        .await?;
        let floor = (|| cluster_raw.cycle(), ONE_SERVER);
        rslock_uncontended_on(&mut report, rslock_client(&cluster_urls, true), floor).await;
    }
    let rtt = cluster_raw.steady_round_trip().await?;
    let counters = Counters::new(&cluster_urls).await?;
    bench::fleet_report_beside(
        &mut report,
        bench::each_own(
            RedisConfig::cluster(cluster_urls.clone()).key_prefix("bench"),
            RedisBackend::connect,
        ),
        (RSLOCK, rslock_client(&cluster_urls, true)),
        rtt,
        FLEET_TIME,
        &counters,
    )
    .await?;
    bench::peer_sweep_report(
        &mut report,
        RSLOCK,
        rslock_client(&cluster_urls, true),
        SWEEP_TIME,
        &["redis-cluster"],
    )
    .await;
    let instances = ["redis-cluster"];
    rslock_renewal(
        &mut report,
        rslock_client(&cluster_urls, true),
        &counters,
        &instances,
    )
    .await;
    many_names(
        &mut report,
        bench::each_own(
            RedisConfig::cluster(cluster_urls.clone()).key_prefix("bench"),
            RedisBackend::connect,
        ),
        &backend,
        &counters,
        &["redis-cluster"],
    )
    .await?;
    report.finish().map_err(|e| e.to_string())
}

/// Redlock's uncontended cycle against its own floor: the raw cycle on the five servers in
/// parallel ([`five_raw_cycles`]), the two alternating op by op (target: at least 0.9x of that
/// rate).
async fn five_servers(
    report: &mut Report,
    client: &LockClient,
    raws: &[Raw<ConnectionManager>],
) -> Result<(), String> {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(30));
    let cycle = bench::uncontended_rounds(client, &options, ROUNDS, PER_ROUND, || {
        five_raw_cycles(raws)
    })
    .await?;
    report.round_ratio(FIVE_SERVERS, &cycle, Some(1.0 / 0.9));
    Ok(())
}

/// The raw floor of Redlock's cycle: each server's `SET NX PX` then compare-and-delete, all
/// five at once.
async fn five_raw_cycles(raws: &[Raw<ConnectionManager>]) -> Result<(), String> {
    futures::future::try_join_all(raws.iter().map(|raw| raw.cycle()))
        .await
        .map(|_| ())
}

/// The hand-off of each Redlock fleet that held 1 ms against one raw round on the five
/// servers at once (each server's `SET NX PX`), the least a waiter's vote costs: the fleets'
/// own ratio is against one server's round trip (none when no fleet ran).
async fn five_servers_handoff(
    report: &mut Report,
    raws: &[Raw<ConnectionManager>],
    fleets: &[bench::Fleet],
) -> Result<(), String> {
    let held = held_1ms(fleets);
    if held.is_empty() {
        return Ok(());
    }
    let round = bench::time_op(PER_ROUND, || async {
        futures::future::try_join_all(raws.iter().map(Raw::set))
            .await
            .map(|_| ())
    })
    .await?;
    for raw in raws {
        raw.delete_key().await?;
    }
    report.stats(
        "raw round trip of the five servers in parallel (SET NX PX on each at once)",
        &round,
    );
    for fleet in held {
        report.ratio(
            &format!(
                "{} clients, hold 1ms: hand-off to another client p50 / raw round trip of the \
                 five servers in parallel p50",
                fleet.clients
            ),
            fleet.handoff.p50,
            round.p50,
            None,
        );
    }
    Ok(())
}

/// The metric of Redlock's cycle against the five servers' raw floor.
const FIVE_SERVERS: &str =
    "uncontended acquire+release / raw floor of the five servers in parallel (means)";

/// The metric of a cycle against one server's raw floor.
const ONE_SERVER: &str = "uncontended acquire+release / raw floor (means)";

/// The server instances of Redlock's five servers.
const REDLOCK_INSTANCES: [&str; 5] = [
    "redlock-0",
    "redlock-1",
    "redlock-2",
    "redlock-3",
    "redlock-4",
];

/// Redlock, against its five servers' floor and against one server's (no target: Redlock
/// writes to five).
async fn redlock(raw: &Raw<ConnectionManager>) -> Result<(), String> {
    let redlock_urls: Vec<String> = var("LOCK_TEST_REDLOCK_URLS")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let counters = Counters::new(&redlock_urls).await?;
    let mut report = Report::new("redlock(5)");
    let backend =
        RedlockBackend::connect(RedlockConfig::new(redlock_urls.clone()).key_prefix("bench"))
            .await
            .map_err(|e| e.to_string())?;
    let mut raws = Vec::with_capacity(redlock_urls.len());
    for url in &redlock_urls {
        raws.push(Raw::new(raw_connection(url).await?));
    }
    if selection::workload(selection::UNCONTENDED) {
        let client = LockClient::new(backend.clone());
        five_servers(&mut report, &client, &raws).await?;
        let raws = &raws;
        rslock_uncontended(
            &mut report,
            &redlock_urls,
            (|| five_raw_cycles(raws), FIVE_SERVERS),
        )
        .await;
        lock_numbers(&mut report, &client, raw, false).await?;
    }
    let rtt = raw.steady_round_trip().await?;
    let fleets = bench::fleet_report_beside(
        &mut report,
        bench::each_own(
            RedlockConfig::new(redlock_urls.clone()).key_prefix("bench"),
            RedlockBackend::connect,
        ),
        (RSLOCK, rslock_client(&redlock_urls, false)),
        rtt,
        FLEET_TIME,
        &counters,
    )
    .await?;
    five_servers_handoff(&mut report, &raws, &fleets).await?;
    bench::peer_sweep_report(
        &mut report,
        RSLOCK,
        rslock_client(&redlock_urls, false),
        SWEEP_TIME,
        &REDLOCK_INSTANCES,
    )
    .await;
    rslock_renewal(
        &mut report,
        rslock_client(&redlock_urls, false),
        &counters,
        &REDLOCK_INSTANCES,
    )
    .await;
    many_names(
        &mut report,
        bench::each_own(
            RedlockConfig::new(redlock_urls.clone()).key_prefix("bench"),
            RedlockBackend::connect,
        ),
        &backend,
        &counters,
        &REDLOCK_INSTANCES,
    )
    .await?;
    report.finish().map_err(|e| e.to_string())
}

fn main() -> std::process::ExitCode {
    conformance_tests::main_with(async {
        run()
            .await
            .map_err(|error| format!("benchmark failed: {error}"))
    })
}
