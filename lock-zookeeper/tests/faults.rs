//! Faults specific to ZooKeeper, run one after another (they stop and pause servers):
//!
//! 1. `leader_killed`: the ensemble's leader is killed while a client connected to it holds a
//!    lock and others wait; the holder keeps the lock (its session moves to another server),
//!    the waiters proceed after release; the killed node is restarted.
//! 2. `server_paused`: the standalone server is paused (SIGSTOP) past the session timeout; the
//!    holder's `lost()` fires, and after SIGCONT a waiter gets the lock on a new session.
//! 3. `no_herd`: 100 waiters on one lock; each hand-off costs O(1) requests and wakes exactly
//!    one waiter, in FIFO order.
//! 4. `curator_interop`: contender nodes written in Curator's layout by a raw client are
//!    respected by this crate, and this crate's nodes are what Curator's algorithm expects.
//! 5. `lost_create_reply`: a proxy drops the connection after the server applied the
//!    contender's `create` but before its reply reached the client; the contender finds its node
//!    again by UUID instead of creating a second one.
//! 6. `missing_root`: a lock root that does not exist yet is created, one node per segment,
//!    and every create the backend sends is counted.
//!
//! Every fault is undone on every path (SIGCONT, restart), even when a case fails.
//! Arguments filter cases by substring.

mod support;
#[path = "support/trace.rs"]
mod trace;

use std::{
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use conformance_tests::{Cases, Failure, Outcome, ensure};
use futures::FutureExt;
use lock_core::{Fence, LockClient, LockError, LockGuard, LockName, LockOptions};
use lock_zookeeper::{OpCounts, ZkBackend, ZkConfig};
use support::{ENSEMBLE_VAR, SERVICES_DIR_VAR, STANDALONE_VAR, ZkStore, hosts, raw_client};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use zookeeper_client::{Acls, Client, CreateMode};

fn main() -> ExitCode {
    trace::install();
    Cases::<Failure>::new("faults")
        .case("leader_killed", || Box::pin(leader_killed()))
        .case("server_paused", || Box::pin(server_paused()))
        .case("no_herd", || Box::pin(no_herd()))
        .case("curator_interop", || Box::pin(curator_interop()))
        .case("lost_create_reply", || Box::pin(lost_create_reply()))
        .case("missing_root", || Box::pin(missing_root()))
        .case("follower_cut_off", || Box::pin(follower_cut_off()))
        .case("leader_touch_lag_left_out", || {
            Box::pin(leader_touch_lag_left_out())
        })
        .on_failure(|| {
            println!("        the last events before the failure:");
            for line in trace::last(400) {
                println!("        {line}");
            }
        })
        .main()
}

fn err(error: impl std::fmt::Display) -> Failure {
    Failure(error.to_string())
}

fn lock_name(tag: &str) -> Result<LockName, Failure> {
    LockName::new(format!("faults/{tag}/{:016x}", rand::random::<u64>())).map_err(err)
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

/// Waits until `check` holds, polling; fails with `what` after `limit`.
async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F) -> Outcome
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Failure>>,
{
    let start = Instant::now();
    loop {
        if check().await? {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(Failure(format!("{what} did not happen within {limit:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// In an ensemble the leader expires sessions, and learns that a session touched a follower
/// only from that follower's next ping answer, up to `tickTime`/2 later. A renewal answered by a
/// follower therefore keeps the session alive on the leader for the session timeout minus up to
/// half a tick from the renewal's send time: the lease's TTL, from which the guard's local
/// deadline is counted, must leave that half tick out (with `ZkConfig::server_tick` unset, the
/// most it can be: a quarter of the session timeout, since the server never negotiates less than
/// two ticks).
async fn leader_touch_lag_left_out() -> Outcome {
    let servers = Server::ensemble()?;
    let follower = &servers[follower_of(&servers).await?];
    let conf = follower
        .four_letters("conf")
        .await
        .ok_or_else(|| Failure("the follower did not answer `conf`".into()))?;
    let tick = conf
        .lines()
        .find_map(|l| l.strip_prefix("tickTime="))
        .and_then(|t| t.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| Failure(format!("no tickTime in the follower's `conf`: {conf}")))?;
    let config = ZkConfig::new(format!("127.0.0.1:{}", follower.port))
        .session_timeout(Duration::from_secs(4));
    let (client, backend) = client(&config).await?;
    let session = backend.session_timeout();
    let name = lock_name("leader-touch-lag")?;
    let guard = client
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let granted = guard.lease().ttl();
    guard.extend(Duration::from_secs(4)).await.map_err(err)?;
    let renewed = guard.lease().ttl();
    guard.release().await.map_err(err)?;
    for (what, ttl) in [("grant", granted), ("renewal", renewed)] {
        ensure!(
            ttl + tick / 2 <= session,
            "a {what} on a follower gave a lease of {ttl:?} for a {session:?} session: the leader may expire the session {:?} after the renewal was sent (tickTime {tick:?})",
            session - tick / 2
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Servers: where they are, their mode, stopping and pausing them (undone on drop).

/// The index of a server of `servers` that is a follower now.
async fn follower_of(servers: &[Server]) -> Result<usize, Failure> {
    for (i, server) in servers.iter().enumerate() {
        if server.mode().await.as_deref() == Some("follower") {
            return Ok(i);
        }
    }
    Err(Failure("no follower in the ensemble".into()))
}

/// One server of `cargo xtask services`: its directory and client port.
#[derive(Debug, Clone)]
struct Server {
    dir: PathBuf,
    port: u16,
}

impl Server {
    fn named(instance: &str) -> Result<Self, Failure> {
        let base = std::env::var(SERVICES_DIR_VAR).map_err(|_| {
            Failure(format!(
                "{SERVICES_DIR_VAR} is not set; run `cargo xtask test`"
            ))
        })?;
        let dir = PathBuf::from(base).join(instance);
        let config = std::fs::read_to_string(dir.join("zoo.cfg"))
            .map_err(|e| Failure(format!("reading {}/zoo.cfg: {e}", dir.display())))?;
        let port = config
            .lines()
            .find_map(|l| l.strip_prefix("clientPort="))
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| Failure(format!("no clientPort in {}/zoo.cfg", dir.display())))?;
        Ok(Self { dir, port })
    }

    fn ensemble() -> Result<Vec<Self>, Failure> {
        (1..=3)
            .map(|i| Self::named(&format!("zk-ensemble-{i}")))
            .collect()
    }

    fn pid(&self) -> Result<u32, Failure> {
        let path = self.dir.join("pid");
        std::fs::read_to_string(&path)
            .map_err(|e| Failure(format!("reading {}: {e}", path.display())))?
            .trim()
            .parse()
            .map_err(|e| Failure(format!("{}: {e}", path.display())))
    }

    /// The answer to a four-letter word, or `None` when the server does not answer in 2 s.
    async fn four_letters(&self, word: &str) -> Option<String> {
        let ask = async {
            let mut stream = TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
            stream.write_all(word.as_bytes()).await.ok()?;
            let mut out = String::new();
            stream.read_to_string(&mut out).await.ok()?;
            Some(out)
        };
        tokio::time::timeout(Duration::from_secs(2), ask)
            .await
            .ok()
            .flatten()
    }

    /// `leader`, `follower`, `standalone`, or `None` when not serving.
    async fn mode(&self) -> Option<String> {
        let out = self.four_letters("srvr").await?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    }

    /// Whether a session with this id is connected to this server.
    async fn serves_session(&self, session: i64) -> bool {
        let needle = format!("sid=0x{session:x}");
        self.four_letters("cons")
            .await
            .is_some_and(|out| out.contains(&needle))
    }

    fn run(&self, script: &str) -> Outcome {
        let path = self.dir.join(script);
        let status = std::process::Command::new("bash")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| Failure(format!("running {}: {e}", path.display())))?;
        if status.success() {
            Ok(())
        } else {
            Err(Failure(format!("{} failed: {status}", path.display())))
        }
    }
}

fn signal(pid: u32, signal: &str) -> Outcome {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| Failure(format!("kill -{signal} {pid}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Failure(format!("kill -{signal} {pid} failed: {status}")))
    }
}

/// A server stopped with SIGSTOP; SIGCONT on drop (on every path).
struct Paused {
    pid: u32,
    resumed: bool,
}

impl Paused {
    fn new(server: &Server) -> Result<Self, Failure> {
        let pid = server.pid()?;
        signal(pid, "STOP")?;
        Ok(Self {
            pid,
            resumed: false,
        })
    }

    fn resume(&mut self) -> Outcome {
        self.resumed = true;
        signal(self.pid, "CONT")
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if !self.resumed {
            let _ = signal(self.pid, "CONT");
        }
    }
}

/// A server stopped with its `stop` script; started again on drop (on every path).
struct Killed {
    server: Server,
    restarted: bool,
}

impl Killed {
    async fn new(server: &Server) -> Result<Self, Failure> {
        let stopping = server.clone();
        tokio::task::spawn_blocking(move || stopping.run("stop"))
            .await
            .map_err(err)??;
        Ok(Self {
            server: server.clone(),
            restarted: false,
        })
    }

    /// Starts it again and waits until it serves.
    async fn restart(&mut self) -> Outcome {
        self.restarted = true;
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || server.run("start"))
            .await
            .map_err(err)??;
        let server = &self.server;
        wait_until(
            Duration::from_secs(30),
            "the restarted node serving",
            || async { Ok(server.mode().await.is_some()) },
        )
        .await
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if !self.restarted {
            let _ = self.server.run("start");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. The ensemble's leader is killed under a holder connected to it.

async fn leader_killed() -> Outcome {
    let hosts = hosts(ENSEMBLE_VAR).map_err(Failure)?;
    let servers = Server::ensemble()?;
    let mut leader = None;
    for server in &servers {
        if server.mode().await.as_deref() == Some("leader") {
            leader = Some(server.clone());
        }
    }
    let leader = leader.ok_or_else(|| Failure("no ensemble node reports `Mode: leader`".into()))?;
    // Long enough for an election and a reconnection; the point is that the session survives.
    let config = ZkConfig::new(hosts.clone()).session_timeout(Duration::from_secs(8));
    // A holder whose session is on the leader, so that killing the leader moves it.
    let mut holder = None;
    for _ in 0..30 {
        let (client, backend) = client(&config).await?;
        if leader.serves_session(backend.session_id()).await {
            holder = Some((client, backend));
            break;
        }
    }
    let (holder, holder_backend) =
        holder.ok_or_else(|| Failure("no session landed on the leader in 30 tries".into()))?;
    let name = lock_name("leader-killed")?;
    let options = LockOptions::new().wait(Duration::from_secs(60));
    let guard = holder.lock_with(&name, &options).await.map_err(err)?;
    let fence = guard.fence();
    let token = guard.lease().token().clone();
    let mut lost = guard.lost();

    let store = ZkStore::from_env(ENSEMBLE_VAR, Duration::from_secs(8))
        .await
        .map_err(Failure)?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..3 {
        let (waiter, _) = client(&config).await?;
        waiters.spawn(take_record_release(
            i,
            waiter,
            name.clone(),
            options.clone(),
            order.clone(),
        ));
        // Queue them one after another so the expected order is known.
        wait_until(Duration::from_secs(10), "a waiter queueing", || async {
            Ok(store.children(&name).await.map_err(err)?.len() == i + 2)
        })
        .await?;
    }

    let killed_at = Instant::now();
    let mut killed = Killed::new(&leader).await?;
    let others: Vec<_> = servers.iter().filter(|s| s.port != leader.port).collect();
    wait_until(Duration::from_secs(30), "a new leader elected", || async {
        for server in &others {
            if server.mode().await.as_deref() == Some("leader") {
                return Ok(true);
            }
        }
        Ok(false)
    })
    .await?;
    let elected = killed_at.elapsed();
    // Watch the holder for longer than a session timeout: it only stays held if renewals
    // succeed on the session's new server.
    let watch_for = holder_backend.session_timeout() + Duration::from_secs(2);
    while killed_at.elapsed() < watch_for {
        ensure!(
            guard.is_held(),
            "the holder stopped holding {:?} after the leader was killed",
            killed_at.elapsed()
        );
        ensure!(
            (&mut lost).now_or_never().is_none(),
            "lost() fired after the leader was killed"
        );
        ensure!(guard.fence() == fence, "the fence changed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut moved = false;
    for server in &others {
        moved |= server.serves_session(holder_backend.session_id()).await;
    }
    ensure!(moved, "the holder's session is not on a surviving node");
    let info =
        holder.inspect(&name).await.map_err(err)?.ok_or_else(|| {
            Failure("inspect shows the lock free while the holder holds it".into())
        })?;
    ensure!(
        info.token == token && info.fence == fence,
        "inspect shows another holder"
    );
    // No waiter finished: none got the lock (nor failed) while the holder held it.
    let finished = waiters.try_join_next();
    ensure!(
        finished.is_none() && locked(&order).is_empty(),
        "a waiter finished while the holder held the lock ({finished:?}; fences taken {:?})",
        locked(&order)
    );

    let released = Instant::now();
    guard.release().await.map_err(err)?;
    while let Some(joined) = tokio::time::timeout(Duration::from_secs(20), waiters.join_next())
        .await
        .map_err(|_| {
            Failure("the waiters did not all get the lock within 20 s of the release".into())
        })?
    {
        joined.map_err(err)??;
    }
    let handed_off = released.elapsed();
    let order = locked(&order).clone();
    ensure!(
        order.windows(2).all(|w| w[0] < w[1]) && order.first().is_some_and(|f| *f > fence),
        "the waiters' fences are not increasing after the holder's {fence}: {order:?}"
    );
    killed.restart().await?;
    println!(
        "        leader on port {} killed; new leader after {elected:?}; holder kept fence {fence} on its moved session; 3 waiters served in {handed_off:?}",
        leader.port
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. The standalone server is paused past the session timeout.

async fn server_paused() -> Outcome {
    let server = Server::named("zookeeper")?;
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let timeout = Duration::from_secs(2);
    let config = ZkConfig::new(hosts).session_timeout(timeout);
    let (holder, holder_backend) = client(&config).await?;
    let (waiter, waiter_backend) = client(&config).await?;
    let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(10))
        .await
        .map_err(Failure)?;
    let name = lock_name("paused")?;
    let guard = holder
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let fence = guard.fence();
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(60));
            waiter.lock_with(&name, &options).await
        }
    });
    wait_until(Duration::from_secs(10), "the waiter queueing", || async {
        Ok(store.children(&name).await.map_err(err)?.len() == 2)
    })
    .await?;
    drop(store);
    let (old_holder_session, old_waiter_session) =
        (holder_backend.session_id(), waiter_backend.session_id());

    let mut paused = Paused::new(&server)?;
    let paused_at = Instant::now();
    tracing::info!("test: server paused");
    let reason = tokio::time::timeout(timeout * 2, guard.lost())
        .await
        .map_err(|_| {
            Failure(format!(
                "lost() did not fire within {:?} of the pause",
                timeout * 2
            ))
        })?;
    let lost_after = paused_at.elapsed();
    ensure!(!guard.is_held(), "is_held() is true after lost()");
    ensure!(
        lost_after <= timeout,
        "lost() fired {lost_after:?} into the pause, after the {timeout:?} session timeout"
    );
    // Past what the client allows a session (7/5 of its timeout) without the server: both
    // clients give their sessions up.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(paused_at.elapsed())).await;
    if waiting.is_finished() {
        paused.resume()?;
        let result = waiting.await.map_err(err)?;
        return Err(Failure(format!(
            "the waiter finished while the server was paused: {result:?}"
        )));
    }
    paused.resume()?;
    let resumed_at = Instant::now();
    tracing::info!("test: server resumed");

    let mut waiting = waiting;
    let next = match tokio::time::timeout(Duration::from_secs(20), &mut waiting).await {
        Ok(joined) => joined
            .map_err(err)?
            .map_err(|e| Failure(format!("the waiter failed: {e}")))?,
        Err(_) => {
            let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(10))
                .await
                .map_err(Failure)?;
            let children = store.children(&name).await.map_err(err)?;
            waiting.abort();
            return Err(Failure(format!(
                "the waiter did not get the lock within 20 s of the resume; the lock node has {children:?}; waiter {waiter_backend:?} sent {:?}",
                waiter_backend.operations()
            )));
        }
    };
    let took = resumed_at.elapsed();
    ensure!(
        next.fence() > fence,
        "fence {} after the lost holder's {fence}",
        next.fence()
    );
    ensure!(
        waiter_backend.session_id() != old_waiter_session,
        "the waiter did not move to a new session"
    );
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(LockError::Lost { .. })),
        "releasing the lost hold returned {released:?}, expected Lost"
    );
    // The late release changed nothing for the new holder.
    let info = holder.inspect(&name).await.map_err(err)?;
    ensure!(
        info.is_some_and(|i| i.token == *next.lease().token()) && next.is_held(),
        "the lost holder's late release disturbed the new holder"
    );
    next.release().await.map_err(err)?;
    // The old holder's backend opens a new session for its next acquisition.
    let again = holder
        .lock_with(&name, &LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .map_err(err)?;
    ensure!(
        holder_backend.session_id() != old_holder_session,
        "the holder's backend did not open a new session"
    );
    again.release().await.map_err(err)?;
    println!(
        "        lost() after {lost_after:?} ({reason}); after resume the waiter got the lock on a new session in {took:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. 100 waiters: O(1) requests per hand-off, no herd, FIFO.

async fn no_herd() -> Outcome {
    const WAITERS: usize = 100;
    const BACKENDS: usize = 10;
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let config = ZkConfig::new(hosts).session_timeout(Duration::from_secs(10));
    let mut clients = Vec::new();
    for _ in 0..BACKENDS {
        clients.push(client(&config).await?);
    }
    let total = |clients: &[(LockClient, ZkBackend)]| {
        clients
            .iter()
            .map(|(_, backend)| backend.operations())
            .sum::<OpCounts>()
    };
    let name = lock_name("herd")?;
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
    wait_until(Duration::from_secs(30), "100 waiters watching", || {
        let clients = &clients;
        async move { Ok(total(clients).watches - before_queue.watches >= WAITERS as u64) }
    })
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
    let after = total(&clients);
    let handoffs = WAITERS as u64;
    let spent = after.total() - queued.total();
    let lists = after.lists - queued.lists;
    let fences = locked(&acquired).clone();
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

// ---------------------------------------------------------------------------------------------
// 4. Curator's layout, both ways.

/// Curator's `StandardLockInternalsDriver`: sort by the text after `lock-`, hold when first,
/// else watch the one before. Returns the node to watch, or `None` when `ours` holds.
fn curator_decides(children: &[String], ours: &str) -> Result<Option<String>, Failure> {
    let key = |c: &str| c.split_once("lock-").map(|(_, s)| s.to_owned());
    let mut sorted: Vec<_> = children.to_vec();
    sorted.sort_by_key(|c| key(c));
    let at = sorted
        .iter()
        .position(|c| c == ours)
        .ok_or_else(|| Failure(format!("Curator's node {ours} is not among {children:?}")))?;
    Ok(at.checked_sub(1).map(|i| sorted[i].clone()))
}

async fn curator_create(curator: &Client, path: &str) -> Result<(String, i64), Failure> {
    let uuid = uuid::Uuid::new_v4();
    let prefix = format!("{path}/_c_{uuid}-lock-");
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (stat, sequence) = curator
        .create(&prefix, b"127.0.0.1", &options)
        .await
        .map_err(err)?;
    Ok((format!("_c_{uuid}-lock-{sequence}"), stat.czxid))
}

async fn curator_interop() -> Outcome {
    let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(4))
        .await
        .map_err(Failure)?;
    let backend = store.backend().await?;
    let ours = LockClient::new(backend.clone());
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let curator = raw_client(&hosts, Duration::from_secs(4))
        .await
        .map_err(Failure)?;

    // Ours waits behind a lower Curator contender.
    let name = lock_name("curator-first")?;
    let path = store.ensure_lock_node(&name).await.map_err(err)?;
    let (theirs, czxid) = curator_create(&curator, &path).await?;
    let try_now = ours
        .try_lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    ensure!(
        try_now.is_none(),
        "we took a lock held by a Curator contender"
    );
    let info = ours
        .inspect(&name)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("inspect shows the Curator-held lock as free".into()))?;
    ensure!(
        info.token.as_str() == theirs && info.fence.get() == czxid as u64,
        "inspect does not show the Curator contender"
    );
    let watches = backend.operations().watches;
    let waiting = tokio::spawn({
        let (ours, name) = (ours.clone(), name.clone());
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(20));
            let guard = ours.lock_with(&name, &options).await;
            (Instant::now(), guard)
        }
    });
    wait_until(
        Duration::from_secs(10),
        "our contender queueing",
        || async { Ok(store.children(&name).await.map_err(err)?.len() == 2) },
    )
    .await?;
    // Waiting for real: it has set its watch on the Curator contender.
    wait_until(
        Duration::from_secs(10),
        "our contender watching the Curator contender",
        || async { Ok(backend.operations().watches > watches) },
    )
    .await?;
    ensure!(
        !waiting.is_finished(),
        "we did not wait for the Curator contender"
    );
    let released = Instant::now();
    curator
        .delete(&format!("{path}/{theirs}"), None)
        .await
        .map_err(err)?;
    let (acquired, guard) = waiting.await.map_err(err)?;
    let guard = guard.map_err(err)?;
    ensure!(
        guard.fence().get() > czxid as u64,
        "our fence is not above the Curator contender's"
    );
    let wake = acquired - released;
    guard.release().await.map_err(err)?;

    // Theirs waits behind ours, by Curator's own rules.
    let name = lock_name("ours-first")?;
    let path = store.ensure_lock_node(&name).await.map_err(err)?;
    let guard = ours
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let token = guard.lease().token().clone();
    let our_node = token
        .as_str()
        .split_once('/')
        .map(|(node, _)| node.to_owned())
        .ok_or_else(|| Failure("our token does not start with the node name".into()))?;
    // Curator's `ProtectedUtils.isProtectedZNode`: `_c_`, more than 40 characters, `-` at 39.
    ensure!(
        our_node.starts_with("_c_") && our_node.len() > 40 && our_node.as_bytes()[39] == b'-',
        "our node {our_node} is not in Curator's protected layout"
    );
    let (theirs, _) = curator_create(&curator, &path).await?;
    let children = store.children(&name).await.map_err(err)?;
    let watch = curator_decides(&children, &theirs)?;
    ensure!(
        watch.as_deref() == Some(our_node.as_str()),
        "Curator's algorithm would watch {watch:?}, not our holder {our_node}"
    );
    guard.release().await.map_err(err)?;
    let children = store.children(&name).await.map_err(err)?;
    ensure!(
        curator_decides(&children, &theirs)?.is_none(),
        "after our release Curator's contender is not first: {children:?}"
    );
    // And while Curator holds, we wait.
    let busy = ours
        .try_lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    ensure!(
        busy.is_none(),
        "we took the lock Curator's contender now holds"
    );
    curator
        .delete(&format!("{path}/{theirs}"), None)
        .await
        .map_err(err)?;
    ensure!(
        store.children(&name).await.map_err(err)?.is_empty(),
        "nodes left behind"
    );
    println!(
        "        waited behind a Curator contender (woke {wake:?} after its delete); Curator's rules queue behind ours"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 5. The create's reply is lost: a proxy cuts the connection after the server answered.

/// A TCP proxy to one ZooKeeper server that, when armed, forwards the next successful
/// `create2` request and then closes the connection instead of forwarding its reply.
struct Proxy {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const OP_CREATE2: i32 = 15;

impl Proxy {
    async fn start(upstream: SocketAddr) -> Result<Self, Failure> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (armed, cuts) = (armed.clone(), cuts.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (armed, cuts) = (armed.clone(), cuts.clone());
                    tokio::spawn(async move {
                        let _ = relay(client, upstream, armed, cuts).await;
                    });
                }
            }
        });
        Ok(Self {
            addr,
            armed,
            cuts,
            task,
        })
    }
}

/// Splits complete length-prefixed frames off the front of `buf`.
fn frames(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(len) = buf
            .get(..4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return out;
        };
        let total = 4 + usize::try_from(len).unwrap_or(0);
        if buf.len() < total {
            return out;
        }
        out.push(buf.drain(..total).collect());
    }
}

fn int_at(frame: &[u8], at: usize) -> Option<i32> {
    frame
        .get(at..at + 4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    // The first frame each way is the connect request / response, without a header.
    let (mut client_started, mut server_started) = (false, false);
    let mut cut_xid = None;
    loop {
        tokio::select! {
            read = client_read.read_buf(&mut from_client) => {
                if read? == 0 {
                    return Ok(());
                }
                for frame in frames(&mut from_client) {
                    // Request: length, xid, opcode.
                    if client_started
                        && int_at(&frame, 8) == Some(OP_CREATE2)
                        && armed.swap(false, Ordering::SeqCst)
                    {
                        cut_xid = int_at(&frame, 4);
                    }
                    client_started = true;
                    server_write.write_all(&frame).await?;
                }
            }
            read = server_read.read_buf(&mut from_server) => {
                if read? == 0 {
                    return Ok(());
                }
                for frame in frames(&mut from_server) {
                    // Reply: length, xid, zxid (8 bytes), error code.
                    if server_started && cut_xid.is_some() && int_at(&frame, 4) == cut_xid {
                        if int_at(&frame, 16) == Some(0) {
                            // Applied by the server; the client never hears of it.
                            cuts.fetch_add(1, Ordering::SeqCst);
                            return Ok(());
                        }
                        cut_xid = None;
                        armed.store(true, Ordering::SeqCst);
                    }
                    server_started = true;
                    client_write.write_all(&frame).await?;
                }
            }
        }
    }
}

async fn lost_create_reply() -> Outcome {
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let upstream: SocketAddr = hosts
        .split(',')
        .next()
        .and_then(|h| h.trim().parse().ok())
        .ok_or_else(|| Failure(format!("{STANDALONE_VAR}={hosts} is not one `ip:port`")))?;
    let proxy = Proxy::start(upstream).await?;
    let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(4))
        .await
        .map_err(Failure)?;
    let name = lock_name("lost-reply")?;
    // The lock node exists, so the contender's create is the first create2 and succeeds.
    store.ensure_lock_node(&name).await.map_err(err)?;
    let config = ZkConfig::new(proxy.addr.to_string()).session_timeout(Duration::from_secs(4));
    let (client, backend) = client(&config).await?;
    let session = backend.session_id();
    let before = backend.operations();
    proxy.armed.store(true, Ordering::SeqCst);
    let guard: LockGuard = client
        .lock_with(&name, &LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .map_err(|e| Failure(format!("acquire after a lost create reply: {e}")))?;
    let spent = backend.operations();
    ensure!(
        proxy.cuts.load(Ordering::SeqCst) == 1,
        "the proxy did not cut a create's reply"
    );
    ensure!(
        backend.session_id() == session,
        "the session changed: this tested reconnection, not a lost reply"
    );
    ensure!(
        spent.creates - before.creates == 1,
        "{} creates: the contender created a second node instead of finding its own",
        spent.creates - before.creates
    );
    let children = store.children(&name).await.map_err(err)?;
    let token = guard.lease().token().as_str().to_owned();
    ensure!(
        children.len() == 1 && token.starts_with(&format!("{}/", children[0])),
        "after the lost reply the lock node has {children:?}; expected only our node"
    );
    guard.release().await.map_err(err)?;
    ensure!(
        store.children(&name).await.map_err(err)?.is_empty(),
        "nodes left after release"
    );
    println!(
        "        create reply dropped by the proxy; node found again by its UUID ({:?} -> {spent:?})",
        before
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 6. A lock root that does not exist yet.

async fn missing_root() -> Outcome {
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let top = format!("/faults-root-{:016x}", rand::random::<u64>());
    let root = format!("{top}/locks");
    let config = ZkConfig::new(hosts.clone())
        .session_timeout(Duration::from_secs(4))
        .root(root.clone());
    let (client, backend) = client(&config).await?;
    let name = lock_name("missing-root")?;
    let before = backend.operations();
    let guard = client
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let spent = backend.operations();
    // The contender and the container (both answered NoNode), each segment of the root, the
    // container, the contender: six creates sent, six counted.
    ensure!(
        spent.creates - before.creates == 6,
        "{} creates counted for a two-segment missing root ({before:?} -> {spent:?}); expected 6",
        spent.creates - before.creates
    );
    guard.release().await.map_err(err)?;
    let admin = raw_client(&hosts, Duration::from_secs(4))
        .await
        .map_err(Failure)?;
    let made = admin.list_children(&top).await.map_err(err)?;
    ensure!(
        made == ["locks"],
        "the root's top node has {made:?}, expected only `locks`"
    );
    // Clean-up, deepest first (the empty container may already be gone).
    for path in [config.lock_path(&name), root, top] {
        match admin.delete(&path, None).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            Err(e) => return Err(Failure(format!("deleting {path}: {e}"))),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A follower cut off from its leader cannot confirm a hold (review finding 6).

/// A holder connected only to a follower: the other two nodes (the leader among them) are
/// paused, so the follower is cut off from the quorum but still answers local reads until it
/// notices. A renewal it answers from its own state would extend the local deadline while the
/// leader may expire the session; so no renewal may succeed then.
async fn follower_cut_off() -> Outcome {
    let servers = Server::ensemble()?;
    let follower = follower_of(&servers).await?;
    let config = ZkConfig::new(format!("127.0.0.1:{}", servers[follower].port))
        .session_timeout(Duration::from_secs(6));
    let (client, _backend) = client(&config).await?;
    let name = lock_name("follower-cut-off")?;
    let guard = client
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let mut paused = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        if i != follower {
            paused.push(Paused::new(server)?);
        }
    }
    let extended = tokio::time::timeout(
        Duration::from_millis(1500),
        guard.extend(Duration::from_secs(6)),
    )
    .await;
    for pause in &mut paused {
        pause.resume()?;
    }
    drop(paused);
    ensure!(
        !matches!(extended, Ok(Ok(()))),
        "a follower cut off from its leader confirmed the hold (extend returned Ok)"
    );
    wait_until(
        Duration::from_secs(30),
        "the ensemble serving again",
        || async {
            for server in &servers {
                if server.mode().await.is_none() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    drop(guard);
    Ok(())
}
