//! A campaign on one store: worker processes, the fenced resource, seeded faults, and the
//! judged history.

use std::{
    collections::HashMap,
    process::Stdio,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use conformance_tests::faults::signal;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

use crate::{
    Fault, Findings, History, Nanos, Record, Resource, WorkerEnd, check, clock, links::Links,
    server, store_faults, stores,
};

/// What a campaign does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The store (one of [`stores::STORES`]).
    pub store: String,
    /// Worker processes at a time.
    pub workers: usize,
    /// How long the workers contend.
    pub duration: Duration,
    /// The seed of every random choice (faults, and each worker's).
    pub seed: u64,
    /// How many lock names (1: everyone on one lock).
    pub names: usize,
    /// The lease TTL.
    pub ttl: Duration,
    /// The wait budget of each acquire.
    pub wait: Duration,
    /// Whether faults are injected.
    pub faults: bool,
    /// Whether the resource checks fences (`false`: the negative control).
    pub check_fences: bool,
    /// How often (per mille of its writes) a worker freezes itself between deciding to write
    /// and writing (see [`crate::worker::Job::pause_writes`]); 0 without faults.
    pub pause_writes: u32,
}

/// What a campaign found, as the JSON summary writes it.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The store.
    pub store: String,
    /// The seed.
    pub seed: u64,
    /// Seconds the workers contended.
    pub seconds: f64,
    /// Whether the store declares strict fencing.
    pub strict: bool,
    /// The faults injected, by kind.
    pub faults: HashMap<String, u64>,
    /// The findings.
    pub findings: Findings,
    /// What fails the run (empty: it passed).
    pub violations: Vec<String>,
}

/// The workers' records and how their processes ended, shared with the reader tasks.
#[derive(Default)]
struct Records {
    records: Vec<Record>,
    exits: Vec<WorkerEnd>,
}

/// A running worker process.
struct Worker {
    id: u32,
    child: Child,
}

struct Run {
    plan: Plan,
    exe: std::path::PathBuf,
    resource: String,
    until: Nanos,
    names: Vec<String>,
    shared: Arc<Mutex<Records>>,
    next_id: u32,
    /// The tasks reading the workers' records.
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// The relays workers reach the store through (with faults, where the store allows).
    links: Option<Links>,
}

impl Run {
    fn spawn(&mut self) -> Result<Worker, String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut child = Command::new(&self.exe)
            .arg("worker")
            .args(["--store", &self.plan.store])
            .args(["--id", &id.to_string()])
            .args(["--names", &self.names.join(",")])
            .args(["--ttl-ms", &self.plan.ttl.as_millis().to_string()])
            .args(["--wait-ms", &self.plan.wait.as_millis().to_string()])
            .args(["--until-ns", &self.until.to_string()])
            .args(["--resource", &self.resource])
            .args(["--seed", &self.plan.seed.to_string()])
            .args(["--pause-writes", &self.pause_writes().to_string()])
            .args(["--campaign", &std::process::id().to_string()])
            .envs(
                self.links
                    .iter()
                    .flat_map(|links| links.env().iter().cloned()),
            )
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting a worker ({}): {e}", self.exe.display()))?;
        let stdout = child.stdout.take().ok_or("a worker without its output")?;
        let shared = self.shared.clone();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(record) = serde_json::from_str::<Record>(&line) {
                    shared
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .records
                        .push(record);
                }
            }
        });
        self.readers.push(reader);
        Ok(Worker { id, child })
    }

    fn pause_writes(&self) -> u32 {
        if self.plan.faults {
            self.plan.pause_writes
        } else {
            0
        }
    }

    /// The worker holding a lock now, as its records say (its latest grant has no end).
    fn holder(&self, workers: &[Worker]) -> Option<usize> {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let mut open: HashMap<u32, bool> = HashMap::new();
        for record in &shared.records {
            match record {
                Record::Grant(s) => {
                    open.insert(s.worker, true);
                }
                Record::End { worker, .. } => {
                    open.insert(*worker, false);
                }
                Record::Done(_) => {}
            }
        }
        workers
            .iter()
            .position(|w| open.get(&w.id).copied().unwrap_or(false))
    }
}

/// How long no holder is a stuck gap.
fn stuck_after(plan: &Plan, history: &History) -> Nanos {
    // Stuck: no holder for longer than the TTL plus the wait budget, where the TTL is the
    // time participants that died or froze can keep the lock from others: the leases' own
    // TTL, or longer where the store keeps their places ([`stores::place_kept`]). With many
    // names a name nobody happened to pick is free without being stuck: judged with one.
    let ttl = history
        .sections
        .iter()
        .map(|s| s.ttl)
        .max()
        .unwrap_or(0)
        .max(u64::try_from(plan.ttl.as_nanos()).unwrap_or(u64::MAX))
        .max(
            u64::try_from(stores::place_kept(&plan.store, plan.ttl * 3).as_nanos())
                .unwrap_or(u64::MAX),
        );
    if plan.names > 1 {
        u64::MAX
    } else {
        ttl.saturating_add(u64::try_from(plan.wait.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Whether `plan` can run.
fn validate(plan: &Plan) -> Result<(), String> {
    if plan.workers == 0
        || plan.names == 0
        || plan.ttl < Duration::from_millis(10)
        || plan.ttl > Duration::from_secs(600)
        || plan.duration > Duration::from_secs(86_400)
    {
        return Err(format!(
            "a campaign needs workers >= 1, names >= 1, a TTL from 10 ms to 10 min and at most a day: {plan:?}"
        ));
    }
    Ok(())
}

/// Runs `plan`: its history and summary. The campaign's own binary (`exe`) runs the workers
/// (its `worker` subcommand).
///
/// # Errors
/// When the store, a worker or a server script cannot be started.
pub async fn run(plan: &Plan, exe: std::path::PathBuf) -> Result<(History, Summary), String> {
    validate(plan)?;
    let client = stores::connect(&plan.store).await?;
    let strict = stores::strict(&client);
    drop(client);
    let resource = Arc::new(Resource::new(plan.check_fences));
    let addr = server::serve(resource.clone()).await?;
    let start = clock::now();
    let until = start + u64::try_from(plan.duration.as_nanos()).unwrap_or(u64::MAX);
    let tag = format!("{:08x}", plan.seed);
    let mut run = Run {
        plan: plan.clone(),
        exe,
        resource: addr.to_string(),
        until,
        names: (0..plan.names.max(1))
            .map(|i| format!("chaos/{tag}/{i}"))
            .collect(),
        shared: Arc::default(),
        next_id: 1,
        readers: Vec::new(),
        links: if plan.faults {
            Links::start(&plan.store).await?
        } else {
            None
        },
    };
    let mut workers = Vec::with_capacity(plan.workers);
    for _ in 0..plan.workers {
        workers.push(run.spawn()?);
    }
    let mut faults = Vec::new();
    if plan.faults {
        inject(&mut run, &mut workers, &mut faults).await?;
    }
    finish(&run, &mut workers).await;
    // Every record the workers wrote, read to the end of their output.
    for reader in run.readers.drain(..) {
        let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
    }
    let end = clock::now().min(until);
    let mut history = History::new(start, end, 0);
    let shared = std::mem::take(&mut *run.shared.lock().unwrap_or_else(PoisonError::into_inner));
    history.add(shared.records);
    history.stuck_after = stuck_after(plan, &history);
    history.workers.extend(shared.exits);
    history.writes = resource.log();
    history.faults = faults;
    let findings = check(&history);
    let mut by_kind: HashMap<String, u64> = HashMap::new();
    for fault in &history.faults {
        let kind = fault.what.split(' ').next().unwrap_or("").to_owned();
        *by_kind.entry(kind).or_default() += 1;
    }
    let summary = Summary {
        store: plan.store.clone(),
        seed: plan.seed,
        seconds: (end - start) as f64 / 1e9,
        strict,
        faults: by_kind,
        violations: findings.violations(strict),
        findings,
    };
    Ok((history, summary))
}

/// Workers that froze themselves in their write path (see [`Plan::pause_writes`]): each is
/// continued after 1.5-3 TTLs.
struct SelfPaused {
    /// By pid: the worker, since when, until when.
    frozen: HashMap<u32, (u32, Nanos, Nanos)>,
    /// Draws how long each pause lasts.
    rng: StdRng,
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next())
            .is_some_and(|state| state == "T")
    })
}

impl SelfPaused {
    /// Notes newly frozen workers (but `except`, which the campaign stopped itself) and
    /// continues those whose pause is over.
    fn tend(
        &mut self,
        workers: &[Worker],
        ttl: Duration,
        except: Option<u32>,
        faults: &mut Vec<Fault>,
    ) {
        let now = clock::now();
        for worker in workers {
            let Some(pid) = worker.child.id() else {
                continue;
            };
            if Some(pid) == except || self.frozen.contains_key(&pid) || !is_stopped(pid) {
                continue;
            }
            let lasts = ttl.mul_f64(self.rng.random_range(1.5..3.0));
            let until = now + u64::try_from(lasts.as_nanos()).unwrap_or(0);
            self.frozen.insert(pid, (worker.id, now, until));
        }
        let over: Vec<u32> = self
            .frozen
            .iter()
            .filter(|(_, (_, _, until))| *until <= now)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in over {
            self.resume(pid, faults);
        }
    }

    fn resume(&mut self, pid: u32, faults: &mut Vec<Fault>) {
        if let Some((worker, from, _)) = self.frozen.remove(&pid) {
            // A process gone meanwhile (killed by a fault) needs nothing.
            let _ = signal(pid, "CONT");
            faults.push(Fault {
                what: format!(
                    "gc-pause worker {worker} (froze between deciding to write and writing)"
                ),
                from,
                to: clock::now(),
                outage: false,
            });
        }
    }

    /// Continues every frozen worker.
    fn resume_all(&mut self, faults: &mut Vec<Fault>) {
        let pids: Vec<u32> = self.frozen.keys().copied().collect();
        for pid in pids {
            self.resume(pid, faults);
        }
    }
}

/// Sleeps `how_long` in short steps, tending self-paused workers meanwhile.
async fn wait(
    how_long: Duration,
    workers: &[Worker],
    paused: &mut SelfPaused,
    ttl: Duration,
    except: Option<u32>,
    faults: &mut Vec<Fault>,
) {
    let end = tokio::time::Instant::now() + how_long;
    loop {
        paused.tend(workers, ttl, except, faults);
        let now = tokio::time::Instant::now();
        if now >= end {
            return;
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(20))).await;
    }
}

/// Injects seeded faults until the end: every 0.5-1.5 s one of a paused worker (half the
/// time the holder) for 1.5-3 TTLs, a killed and restarted worker, a fault of the store's
/// servers ([`store_faults::begin`]), or one of the links between workers and servers
/// ([`Links::begin`], where they are relayed); and continues workers that froze themselves
/// in their write path.
async fn inject(
    run: &mut Run,
    workers: &mut Vec<Worker>,
    faults: &mut Vec<Fault>,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(run.plan.seed);
    let mut paused = SelfPaused {
        frozen: HashMap::new(),
        rng: StdRng::seed_from_u64(run.plan.seed.wrapping_add(1)),
    };
    let ttl = run.plan.ttl;
    let margin = u64::try_from((ttl * 4).as_nanos()).unwrap_or(u64::MAX);
    let result = async {
        loop {
            let pause = Duration::from_millis(rng.random_range(500..1500));
            if clock::now() + u64::try_from(pause.as_nanos()).unwrap_or(0) + margin >= run.until {
                return Ok(());
            }
            wait(pause, workers, &mut paused, ttl, None, faults).await;
            let from = clock::now();
            let kinds = if run.links.is_some() { 4 } else { 3 };
            match rng.random_range(0..kinds) {
                0 => {
                    let holder = run.holder(workers).filter(|_| rng.random_bool(0.5));
                    let i = holder.unwrap_or_else(|| rng.random_range(0..workers.len()));
                    let Some(pid) = workers[i].child.id() else {
                        continue;
                    };
                    if paused.frozen.contains_key(&pid) {
                        continue;
                    }
                    let stop = ttl.mul_f64(rng.random_range(1.5..3.0));
                    signal(pid, "STOP").map_err(|f| f.0)?;
                    wait(stop, workers, &mut paused, ttl, Some(pid), faults).await;
                    signal(pid, "CONT").map_err(|f| f.0)?;
                    faults.push(Fault {
                        what: format!(
                            "sigstop worker {}{}",
                            workers[i].id,
                            if holder.is_some() {
                                " (the holder)"
                            } else {
                                ""
                            }
                        ),
                        from,
                        to: clock::now(),
                        outage: false,
                    });
                }
                1 => {
                    let i = rng.random_range(0..workers.len());
                    let mut old = workers.remove(i);
                    if let Some(pid) = old.child.id() {
                        paused.frozen.remove(&pid);
                    }
                    let _ = old.child.start_kill();
                    let _ = old.child.wait().await;
                    workers.push(run.spawn()?);
                    faults.push(Fault {
                        what: format!("sigkill worker {} (restarted)", old.id),
                        from,
                        to: clock::now(),
                        outage: false,
                    });
                }
                2 => {
                    store_fault(run, workers, &mut paused, &mut rng, faults).await?;
                }
                _ => link_fault(run, workers, &mut paused, &mut rng, faults).await,
            }
        }
    }
    .await;
    // Until the end of the run, keep tending; then continue everyone.
    let left = Duration::from_nanos(run.until.saturating_sub(clock::now()));
    wait(left, workers, &mut paused, ttl, None, faults).await;
    paused.resume_all(faults);
    result
}

/// One fault of the store's servers ([`store_faults::begin`]), tending the workers while it
/// lasts; a fault that cannot begin is skipped.
async fn store_fault(
    run: &Run,
    workers: &[Worker],
    paused: &mut SelfPaused,
    rng: &mut StdRng,
    faults: &mut Vec<Fault>,
) -> Result<(), String> {
    let ttl = run.plan.ttl;
    let down = match store_faults::begin(&run.plan.store, ttl, rng).await {
        Ok(down) => down,
        Err(error) => {
            eprintln!("chaos: a store fault could not begin ({error}); skipped");
            return Ok(());
        }
    };
    wait(down.lasts(), workers, paused, ttl, None, faults).await;
    faults.push(down.end().await?);
    Ok(())
}

/// One fault of the links between workers and servers ([`Links::begin`]), tending the
/// workers while it lasts; nothing where the links are not relayed.
async fn link_fault(
    run: &Run,
    workers: &[Worker],
    paused: &mut SelfPaused,
    rng: &mut StdRng,
    faults: &mut Vec<Fault>,
) {
    if let Some(links) = &run.links {
        let ttl = run.plan.ttl;
        let fault = links.begin(ttl, rng);
        wait(fault.lasts(), workers, paused, ttl, None, faults).await;
        faults.push(links.end(fault));
    }
}

/// Waits for the workers to end (they stop at the run's end), killing any that has not a
/// few seconds after; records how each ended.
async fn finish(run: &Run, workers: &mut Vec<Worker>) {
    // None may stay frozen (a worker can freeze itself in a turn begun before the end).
    for worker in workers.iter() {
        if let Some(pid) = worker.child.id() {
            let _ = signal(pid, "CONT");
        }
    }
    let grace = Duration::from_nanos(run.until.saturating_sub(clock::now()))
        + run.plan.wait
        + Duration::from_secs(10);
    for mut worker in workers.drain(..) {
        let status = match tokio::time::timeout(grace, worker.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = worker.child.start_kill();
                worker.child.wait().await.ok()
            }
        };
        // A Rust panic exits with 101 (the worker's panic hook makes any panic do so);
        // any other failure exit is counted as an error of that worker.
        let code = status.and_then(|s| s.code());
        if code.is_some_and(|c| c != 0) {
            let mut end = WorkerEnd {
                worker: worker.id,
                panicked: code == Some(101),
                ..WorkerEnd::default()
            };
            if !end.panicked {
                end.errors.insert(
                    format!("worker exited with {}", code.unwrap_or_default()),
                    1,
                );
            }
            run.shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .exits
                .push(end);
        }
    }
}
