//! `lockctl` as a user runs it, as processes against a real store: `hold` in one process,
//! `ls` and `status` in others show it, `release --force` frees it and the holder's `lost()`
//! fires (the `hold` process says so and exits with 3); every `--json` output parses; bad
//! input gets a clear message and exit code.
//!
//! Needs `LOCK_TEST_REDIS_URL` and `LOCK_TEST_MYSQL_URL` (`cargo xtask test` sets them).

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, ExitCode, Output, Stdio},
    time::{Duration, Instant},
};

use conformance_tests::{Cases, Failure, Outcome, ensure, faults::env_var};
use serde_json::Value;

fn main() -> ExitCode {
    Cases::<Failure>::new("lockctl")
        .limit(Duration::from_secs(60))
        .case("redis/hold_ls_status_release", || Box::pin(redis()))
        .case(
            "mysql_row_lock/hold_ls_status_release",
            || Box::pin(mysql()),
        )
        .case("capabilities_and_bench_json", || {
            Box::pin(capabilities_and_bench())
        })
        .case("bad_input", || Box::pin(bad_input()))
        .case("migrate_runbook", || Box::pin(migrate_runbook()))
        .main()
}

fn lockctl() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.env_remove("LOCK_URL");
    command
}

/// Runs `lockctl --url URL --json ARGS` to its end.
fn run(url: &str, args: &[&str]) -> Result<Output, Failure> {
    lockctl()
        .args(["--url", url, "--json"])
        .args(args)
        .output()
        .map_err(|e| Failure(format!("running lockctl {args:?}: {e}")))
}

/// The JSON `lockctl ARGS` printed, after it succeeded.
fn json(url: &str, args: &[&str]) -> Result<Value, Failure> {
    let output = run(url, args)?;
    ensure!(
        output.status.success(),
        "lockctl {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).map_err(|e| {
        Failure(format!(
            "lockctl {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        ))
    })
}

/// A `lockctl hold` process and its output lines.
struct Holder {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Holder {
    fn start(url: &str, name: &str) -> Result<Self, Failure> {
        let mut child = lockctl()
            .args([
                "--url", url, "--json", "hold", name, "--ttl", "2s", "--wait", "5s",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Failure(format!("starting lockctl hold: {e}")))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Failure("lockctl hold has no output".into()))?;
        Ok(Self {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Its next event (one JSON line).
    fn event(&mut self) -> Result<Value, Failure> {
        let line = self
            .lines
            .next()
            .ok_or_else(|| Failure("lockctl hold ended without a word".into()))?
            .map_err(|e| Failure(e.to_string()))?;
        serde_json::from_str(&line).map_err(|e| Failure(format!("{e}: {line}")))
    }

    /// Waits up to `bound` for the process to end: its exit code.
    fn exit_code(&mut self, bound: Duration) -> Result<Option<i32>, Failure> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| Failure(e.to_string()))? {
                return Ok(status.code());
            }
            if start.elapsed() > bound {
                let _ = self.child.kill();
                return Err(Failure(format!("lockctl hold still runs after {bound:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The whole operator story against `url`.
async fn story(url: &str) -> Outcome {
    let tag = format!("{:016x}", rand::random::<u64>());
    let prefix = format!("lockctl-test/{tag}/");
    let name = format!("{prefix}job");
    let mut holder = Holder::start(url, &name)?;
    let held = holder.event()?;
    ensure!(held["event"] == "held", "hold said {held}");
    let fence = held["fence"]
        .as_u64()
        .ok_or_else(|| Failure(format!("no fence in {held}")))?;

    let listed = json(url, &["ls", &prefix])?;
    ensure!(
        listed.as_array().map(Vec::len) == Some(1)
            && listed[0]["name"] == name.as_str()
            && listed[0]["fence"] == fence
            && listed[0]["holder"] == held["holder"],
        "ls shows {listed}; the holder said {held}"
    );
    let status = json(url, &["status", &name])?;
    ensure!(
        status["held"] == true && status["lock"]["fence"] == fence,
        "status says {status}"
    );

    let forced = json(url, &["release", "--force", &name])?;
    let floor = forced["fence_floor"].as_u64().unwrap_or(0);
    ensure!(
        forced["released"] == true && forced["evicted"]["fence"] == fence && floor > fence,
        "release --force says {forced}"
    );
    // The holder renews every third of its 2 s TTL: it learns within one renewal.
    let lost = holder.event()?;
    ensure!(
        lost["event"] == "lost" && lost["name"] == name.as_str(),
        "after the forced release the holder said {lost}"
    );
    let code = holder.exit_code(Duration::from_secs(5))?;
    ensure!(code == Some(3), "the holder exited with {code:?}, not 3");
    let after = json(url, &["status", &name])?;
    ensure!(
        after["held"] == false,
        "after the release status says {after}"
    );
    let again = json(url, &["release", "--force", &name])?;
    ensure!(again["released"] == false, "a free lock forced: {again}");

    // A holder stopped with Ctrl-C (SIGINT) releases.
    let mut second = Holder::start(url, &name)?;
    let event = second.event()?;
    ensure!(event["event"] == "held", "the second hold said {event}");
    let pid = second.child.id();
    conformance_tests::faults::signal(pid, "INT")?;
    let released = second.event()?;
    ensure!(released["event"] == "released", "after Ctrl-C: {released}");
    let code = second.exit_code(Duration::from_secs(5))?;
    ensure!(
        code == Some(0),
        "after Ctrl-C the holder exited with {code:?}"
    );
    let free = json(url, &["ls", &prefix])?;
    ensure!(
        free.as_array().is_some_and(Vec::is_empty),
        "after Ctrl-C ls shows {free}"
    );
    Ok(())
}

async fn redis() -> Outcome {
    story(&format!(
        "{}?prefix=lockctl",
        env_var("LOCK_TEST_REDIS_URL")?
    ))
    .await
}

async fn mysql() -> Outcome {
    story(&format!(
        "{}?strategy=row-lock&table=lockctl_row_locks",
        env_var("LOCK_TEST_MYSQL_URL")?
    ))
    .await
}

async fn capabilities_and_bench() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let caps = json(&url, &["capabilities"])?;
    ensure!(
        caps["store"] == "redis" && caps["capabilities"]["fencing"] == "Strict",
        "capabilities says {caps}"
    );
    let bench = json(&url, &["bench", "--clients", "3", "--seconds", "1"])?;
    let phases = bench.as_array().cloned().unwrap_or_default();
    ensure!(
        phases.len() == 2
            && phases[1]["clients"] == 3
            && phases
                .iter()
                .all(|p| p["per_second"].as_f64().is_some_and(|r| r > 0.0)),
        "bench says {bench}"
    );
    Ok(())
}

async fn bad_input() -> Outcome {
    for (args, says) in [
        (vec!["--url", "redis://127.0.0.1:0", "ls"], "port"),
        (
            vec!["--url", "ftp://h:1", "ls"],
            "no store this library knows",
        ),
        (
            vec!["--url", "redis://:hunter2@h:1?prefx=a", "ls"],
            "`prefx`",
        ),
        (vec!["ls"], "give --url or set LOCK_URL"),
        (vec!["--url", "memory://", "status", ""], "name"),
    ] {
        let output = lockctl()
            .args(&args)
            .output()
            .map_err(|e| Failure(e.to_string()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        ensure!(
            output.status.code() == Some(1) && stderr.contains(says) && !stderr.contains("hunter2"),
            "lockctl {args:?}: exit {:?}, said {stderr:?}",
            output.status.code()
        );
    }
    // Without --force, release is refused by the argument parser (exit code 2).
    let output = lockctl()
        .args(["--url", "memory://", "release", "x"])
        .output()
        .map_err(|e| Failure(e.to_string()))?;
    ensure!(
        output.status.code() == Some(2),
        "release without --force: {:?}",
        output.status
    );
    // Completions are a script.
    let output = lockctl()
        .args(["completions", "bash"])
        .output()
        .map_err(|e| Failure(e.to_string()))?;
    ensure!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("lockctl"),
        "completions bash: {:?}",
        output.status
    );
    Ok(())
}

/// Runs `lockctl --json migrate ARGS`.
fn step(args: &[&str]) -> Result<Output, Failure> {
    lockctl()
        .args(["--json", "migrate"])
        .args(args)
        .output()
        .map_err(|e| Failure(e.to_string()))
}

/// The step was refused (exit 1, "refused: ...").
fn refused(output: &Output, what: &str) -> Outcome {
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.code() == Some(1) && stderr.contains("refused"),
        "{what} was not refused: {:?} {stderr}",
        output.status
    );
    Ok(())
}

/// The step succeeded: its JSON.
fn done(output: &Output, what: &str) -> Result<Value, Failure> {
    ensure!(
        output.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).map_err(|e| Failure(format!("{what}: {e}")))
}

/// `lockctl migrate` step by step between two stores on the Redis server (two key prefixes),
/// the record on it too: each step refuses while its precondition fails.
async fn migrate_runbook() -> Outcome {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let tag = format!("{:08x}", rand::random::<u32>());
    let from = format!("{url}?prefix=mig-from-{tag}");
    let to = format!("{url}?prefix=mig-to-{tag}");
    let record = format!("{url}?prefix=mig-record-{tag}");
    let unstarted = step(&["status", "--record", &record])?;
    ensure!(
        !unstarted.status.success(),
        "status of a migration nobody started: {:?}",
        unstarted.status
    );
    done(
        &step(&["init", "--from", &from, "--to", &to, "--record", &record])?,
        "init",
    )?;
    let status = done(&step(&["status", "--record", &record])?, "status")?;
    ensure!(
        status["authority"] == "from",
        "a new migration reads {status}"
    );

    // An `old` client still holding in the old store alone: verify refuses.
    let mut old = Holder::start(&from, "jobs/nightly")?;
    ensure!(
        old.event()?["event"] == "held",
        "the old client did not hold"
    );
    refused(
        &step(&["verify", "--from", &from, "--to", &to, "--soak", "500ms"])?,
        "verify with an old client running",
    )?;
    conformance_tests::faults::signal(old.child.id(), "INT")?;
    ensure!(
        old.event()?["event"] == "released",
        "the old client did not release"
    );
    done(
        &step(&["verify", "--from", &from, "--to", &to, "--soak", "500ms"])?,
        "verify",
    )?;
    refused(
        &step(&[
            "finish", "--from", &from, "--record", &record, "--soak", "200ms",
        ])?,
        "finish before the flip",
    )?;
    let flipped = done(&step(&["flip", "--record", &record])?, "flip")?;
    ensure!(
        flipped["authority"] == "to" && flipped["fence_generation"] == 1,
        "the flip says {flipped}"
    );
    refused(&step(&["flip", "--record", &record])?, "a second flip")?;
    refused(
        &step(&["init", "--from", &from, "--to", &to, "--record", &record])?,
        "init after the flip",
    )?;
    // A client still holding in the old store: finish refuses.
    let mut dual = Holder::start(&from, "jobs/nightly")?;
    ensure!(dual.event()?["event"] == "held", "the holder did not hold");
    refused(
        &step(&[
            "finish", "--from", &from, "--record", &record, "--soak", "500ms",
        ])?,
        "finish with a client in the old store",
    )?;
    conformance_tests::faults::signal(dual.child.id(), "INT")?;
    ensure!(
        dual.event()?["event"] == "released",
        "the holder did not release"
    );
    let finished = done(
        &step(&[
            "finish", "--from", &from, "--record", &record, "--soak", "500ms",
        ])?,
        "finish",
    )?;
    ensure!(finished["done"] == true, "finish says {finished}");
    Ok(())
}
