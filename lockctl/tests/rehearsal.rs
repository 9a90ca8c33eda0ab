//! A migration rehearsed as a user runs it, following distributed-lock's README guide ("Moving
//! locks to another store") step by step against real servers: worker processes contend for
//! a lock, two per phase: plain clients of the old store (the fleet before the migration),
//! then `dual` through a `migrate://` URL (a rolling deploy: plain and dual run together), then
//! `new` (dual and new together), while `lockctl migrate init | verify | flip | finish` run
//! between the deploys. A client of the wrong phase refuses to
//! start (`new` before the flip, `old` after it). Every worker's critical sections and every
//! write to a fenced resource are judged by the fault campaign's checker
//! (`lock_chaos::check`): no overlapping holds, no stale write accepted, no fence going back,
//! no stuck lock; and every fence after the flip is above every fence before it.
//!
//! The worker processes are this test binary started again in the worker role.
//!
//! Needs `LOCK_TEST_REDIS_URL` and `LOCK_TEST_ZK_ADDR` (`cargo xtask test` sets them).

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, ExitCode, Stdio},
    sync::{Arc, Mutex, PoisonError},
    thread::JoinHandle,
    time::Duration,
};

use conformance_tests::{Cases, Failure, Outcome, ensure, faults::env_var};
use lock_chaos::{History, Nanos, Record, Resource, check, clock, server, worker};
use serde::{Deserialize, Serialize};

/// Set in a worker process: its [`Spec`] as JSON.
const WORKER_VAR: &str = "LOCKCTL_REHEARSAL_WORKER";

/// The lease TTL and wait budget of the workers.
const TTL: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(2);

/// The first fence of generation 1 (see `lock_core::migrate`).
const GENERATION_1: u64 = 1 << 53;

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(WORKER_VAR) {
        return work(&spec);
    }
    Cases::<Failure>::new("rehearsal")
        .limit(Duration::from_secs(120))
        .case("redis_to_zookeeper", || Box::pin(rehearse()))
        .main()
}

/// What one worker process does.
#[derive(Serialize, Deserialize)]
struct Spec {
    url: String,
    id: u32,
    names: Vec<String>,
    until: Nanos,
    resource: String,
}

/// The worker role: contends until its end time, one JSON record per line on stdout.
fn work(spec: &str) -> ExitCode {
    let run = || -> Result<(), String> {
        let spec: Spec = serde_json::from_str(spec).map_err(|e| e.to_string())?;
        let job = worker::Job {
            store: spec.url,
            id: spec.id,
            names: spec.names,
            ttl: TTL,
            wait: WAIT,
            until: spec.until,
            resource: spec.resource,
            seed: u64::from(spec.id),
            pause_writes: 0,
        };
        tokio::runtime::Runtime::new()
            .map_err(|e| e.to_string())?
            .block_on(worker::run(&job))
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rehearsal worker: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Percent-encodes a store URL for a `migrate://` query value.
fn encode(url: &str) -> String {
    url.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' | b':' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A worker process and the thread reading its records.
struct Worker {
    child: Child,
    reader: JoinHandle<()>,
}

/// The rehearsal's stores, resource and records.
struct Fleet {
    from: String,
    to: String,
    record: String,
    names: Vec<String>,
    resource: String,
    records: Arc<Mutex<Vec<Record>>>,
    next_id: u32,
}

impl Fleet {
    fn url(&self, phase: &str) -> String {
        format!(
            "migrate://?from={}&to={}&record={}&phase={phase}",
            encode(&self.from),
            encode(&self.to),
            encode(&self.record)
        )
    }

    /// Starts a worker of `phase` contending until `until` (`before`: a plain client of the
    /// old store, as the fleet is before the migration).
    fn spawn(&mut self, phase: &str, until: Nanos) -> Result<Worker, Failure> {
        self.next_id += 1;
        let url = if phase == "before" {
            self.from.clone()
        } else {
            self.url(phase)
        };
        let spec = Spec {
            url,
            id: self.next_id,
            names: self.names.clone(),
            until,
            resource: self.resource.clone(),
        };
        let spec = serde_json::to_string(&spec).map_err(|e| Failure(e.to_string()))?;
        let mut child = Command::new(std::env::current_exe().map_err(|e| Failure(e.to_string()))?)
            .env(WORKER_VAR, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Failure(format!("starting a {phase} worker: {e}")))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Failure("the worker has no stdout".into()))?;
        let records = self.records.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(record) = serde_json::from_str::<Record>(&line) {
                    records
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(record);
                }
            }
        });
        Ok(Worker { child, reader })
    }
}

/// Waits for `workers` to end (they stop at their end time) and checks they succeeded.
async fn wait_out(workers: Vec<Worker>, phase: &str) -> Outcome {
    for mut worker in workers {
        let status = tokio::task::spawn_blocking(move || {
            let status = worker.child.wait();
            let _ = worker.reader.join();
            status
        })
        .await
        .map_err(|e| Failure(e.to_string()))?
        .map_err(|e| Failure(e.to_string()))?;
        ensure!(status.success(), "a {phase} worker failed: {status}");
    }
    Ok(())
}

/// `lockctl`, without the `LOCK_URL` this process may have.
fn lockctl_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.env_remove("LOCK_URL");
    command
}

/// Runs `lockctl --json ARGS` (with `--url` when given) and returns its exit status and
/// output.
fn lockctl(url: Option<&str>, args: &[&str]) -> Result<(bool, String), Failure> {
    let mut command = lockctl_command();
    command.arg("--json");
    if let Some(url) = url {
        command.args(["--url", url]);
    }
    let output = command
        .args(args)
        .output()
        .map_err(|e| Failure(format!("running lockctl {args:?}: {e}")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), text))
}

/// `lockctl migrate STEP ...` must succeed.
fn step(args: &[&str]) -> Outcome {
    let (ok, text) = lockctl(None, args)?;
    ensure!(ok, "lockctl {} refused: {text}", args.join(" "));
    Ok(())
}

fn at(start: Nanos, seconds: f64) -> Nanos {
    start + Duration::from_secs_f64(seconds).as_nanos() as Nanos
}

async fn sleep_until(when: Nanos) {
    let now = clock::now();
    if when > now {
        tokio::time::sleep(Duration::from_nanos(when - now)).await;
    }
}

async fn rehearse() -> Outcome {
    let redis = env_var("LOCK_TEST_REDIS_URL")?;
    let zk = env_var("LOCK_TEST_ZK_ADDR")?;
    let run = format!("{:08x}", rand::random::<u32>());
    let resource = Arc::new(Resource::new(true));
    let address = server::serve(resource.clone()).await.map_err(Failure)?;
    let mut fleet = Fleet {
        from: format!("{redis}?prefix=rehearsal-{run}"),
        to: format!("zk://{zk}/rehearsal-{run}"),
        record: format!("{redis}?prefix=rehearsal-record-{run}"),
        // One lock: every worker of every phase contends for it.
        names: vec!["jobs/nightly".to_owned()],
        resource: address.to_string(),
        records: Arc::default(),
        next_id: 0,
    };
    let (from, to, record) = (fleet.from.clone(), fleet.to.clone(), fleet.record.clone());

    // Before the migration: the fleet is plain clients of the old store.
    let start = clock::now();
    let old = vec![
        fleet.spawn("before", at(start, 7.0))?,
        fleet.spawn("before", at(start, 7.0))?,
    ];
    // Step 1: init.
    sleep_until(at(start, 1.0)).await;
    step(&[
        "migrate", "init", "--from", &from, "--to", &to, "--record", &record,
    ])?;
    // A `new` client refuses to start before the flip.
    let (ok, text) = lockctl(Some(&fleet.url("new")), &["status", "jobs/nightly"])?;
    ensure!(
        !ok && text.contains("before the migration's flip"),
        "a `new` client started before the flip: {text}"
    );
    // Listing takes one store's URL: a migration's locks live in two.
    let (ok, text) = lockctl(Some(&fleet.url("dual")), &["ls"])?;
    ensure!(
        !ok && text.contains("two stores"),
        "`lockctl ls` of a migrate:// URL: {text}"
    );
    // Step 2: deploy `dual` (rolling: the old workers end meanwhile).
    sleep_until(at(start, 2.0)).await;
    let dual = vec![
        fleet.spawn("dual", at(start, 17.0))?,
        fleet.spawn("dual", at(start, 17.0))?,
    ];
    verify_refuses_a_stray_holder(&from, &to)?;
    wait_out(old, "plain").await?;
    // Step 3: verify.
    step(&[
        "migrate", "verify", "--from", &from, "--to", &to, "--soak", "2s",
    ])?;
    // Step 4: flip.
    let flipping = clock::now();
    step(&["migrate", "flip", "--record", &record])?;
    let flipped = clock::now();
    // An `old` client refuses to start after it.
    let (ok, text) = lockctl(Some(&fleet.url("old")), &["status", "jobs/nightly"])?;
    ensure!(
        !ok && text.contains("after the migration's flip"),
        "an `old` client started after the flip: {text}"
    );
    // Step 5: deploy `new` (rolling: the dual workers end meanwhile).
    let new_until = clock::now() + Duration::from_secs(12).as_nanos() as Nanos;
    let new = vec![
        fleet.spawn("new", new_until)?,
        fleet.spawn("new", new_until)?,
    ];
    wait_out(dual, "dual").await?;
    // Step 6: finish.
    step(&[
        "migrate", "finish", "--from", &from, "--record", &record, "--soak", "2s",
    ])?;
    wait_out(new, "new").await?;

    judge(&fleet, &resource, start, (flipping, flipped))
}

/// The whole history, judged by the fault campaign's checker; and the fences across the flip
/// (between `flip.0` and `flip.1`): grants that returned before it have generation 0, grants
/// asked for after it generation 1.
fn judge(fleet: &Fleet, resource: &Resource, start: Nanos, flip: (Nanos, Nanos)) -> Outcome {
    let end = clock::now();
    let mut history = History::new(start, end, (TTL + WAIT).as_nanos() as Nanos);
    history.add(std::mem::take(
        &mut *fleet.records.lock().unwrap_or_else(PoisonError::into_inner),
    ));
    history.writes = resource.log();
    let findings = check(&history);
    let violations = findings.violations(true);
    ensure!(
        violations.is_empty(),
        "the rehearsal's history: {violations:?} ({findings:?})"
    );
    ensure!(
        findings.overlaps == 0,
        "{} overlapping holds ({findings:?})",
        findings.overlaps
    );
    let before = history.sections.iter().filter(|s| s.acquired < flip.0);
    let after = history.sections.iter().filter(|s| s.called > flip.1);
    let highest_before = before.clone().map(|s| s.fence).max().unwrap_or(0);
    let lowest_after = after.clone().map(|s| s.fence).min().unwrap_or(u64::MAX);
    ensure!(
        before.count() > 10 && after.count() > 10,
        "too few grants to judge: {} sections in all",
        history.sections.len()
    );
    ensure!(
        highest_before < GENERATION_1 && lowest_after >= GENERATION_1,
        "fences across the flip: highest before {highest_before}, lowest after {lowest_after}"
    );
    Ok(())
}

/// An old client holding a lock in the old store alone (`lockctl hold` on the old store's
/// URL): `verify` refuses while it holds, naming the lock. (The workers' own holds, 0-50 ms,
/// may go unseen by a short soak: `verify` samples, as the README says.)
fn verify_refuses_a_stray_holder(from: &str, to: &str) -> Outcome {
    let mut stray = lockctl_command()
        .args(["--url", from, "--json", "hold", "jobs/stray", "--ttl", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Failure(format!("starting lockctl hold: {e}")))?;
    let held = stray
        .stdout
        .take()
        .and_then(|out| BufReader::new(out).lines().next())
        .and_then(Result::ok);
    let (ok, text) = lockctl(
        None,
        &[
            "migrate", "verify", "--from", from, "--to", to, "--soak", "1s",
        ],
    )?;
    let _ = stray.kill();
    let _ = stray.wait();
    ensure!(
        held.is_some_and(|line| line.contains("held")),
        "the old store's stray holder did not report its hold"
    );
    ensure!(
        !ok && text.contains("jobs/stray"),
        "verify passed while a client of the old store held a lock there alone: {text}"
    );
    Ok(())
}
