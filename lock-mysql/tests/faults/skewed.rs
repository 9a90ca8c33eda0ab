//! Lease clients whose clock is 10 minutes off, in child processes of this binary run under
//! `faketime` (the role [`child`] plays): the child reports its wall clock, so the test proves
//! the skew took effect.

use std::{
    io::Write as _,
    process::{ExitCode, Stdio},
    time::{Duration, Instant, SystemTime},
};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{env_var, err, signal, unique_name},
    holder_process,
};
use lock_core::{LockError, LockName, LockOptions};
use lock_mysql::{Strategy, TableName};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, ChildStdout},
};

use super::support;

/// The lock name and lease table the child uses (its parent's).
const SKEWED_NAME_VAR: &str = "LOCK_FAULTS_SKEWED_NAME";
const SKEWED_TABLE_VAR: &str = "LOCK_FAULTS_SKEWED_TABLE";

/// The lease TTL of every client here.
const TTL: Duration = Duration::from_secs(2);
/// How far off the children's clocks are.
const SKEW_SECS: i64 = 600;

fn options() -> LockOptions {
    LockOptions::new().ttl(TTL).wait(Duration::ZERO)
}

fn wall_secs() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The child: `hold` acquires (watchdog on), prints `HELD <fence> <pid> <wall clock>` and
/// holds until its stdin closes; `try` tries once and prints `BUSY <wall clock>` or
/// `GOT <fence> <wall clock>`.
pub(super) fn child(role: &str) -> ExitCode {
    let result = conformance_tests::runtime().and_then(|runtime| {
        runtime.block_on(async {
            let (client, name) = super::child_client(SKEWED_NAME_VAR, SKEWED_TABLE_VAR).await?;
            let got = client
                .try_lock_with(&name, &options())
                .await
                .map_err(|e| e.to_string())?;
            let mut out = std::io::stdout();
            let line = match (&got, role) {
                (Some(guard), "hold") => format!(
                    "HELD {} {} {}",
                    guard.fence(),
                    std::process::id(),
                    wall_secs()
                ),
                (Some(guard), _) => format!("GOT {} {}", guard.fence(), wall_secs()),
                (None, _) => format!("BUSY {}", wall_secs()),
            };
            writeln!(out, "{line}").map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
            if let Some(guard) = got {
                if role == "hold" {
                    // Until the parent closes stdin (or kills this process).
                    let _ = tokio::task::spawn_blocking(|| {
                        std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())
                    })
                    .await;
                }
                guard.release().await.map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skewed client: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A child of this binary under `faketime` with its clock `skew_secs` off.
struct Skewed {
    child: Child,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Skewed {
    fn spawn(
        role: &str,
        skew_secs: i64,
        name: &LockName,
        table: &TableName,
    ) -> Result<Self, Failure> {
        let faketime = env_var("LOCK_TEST_FAKETIME")?;
        let mut child = holder_process::child_with_clock(role, &faketime, skew_secs)
            .map_err(Failure)?
            .env(SKEWED_NAME_VAR, name.as_str())
            .env(SKEWED_TABLE_VAR, table.as_str())
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| Failure(format!("running {faketime}: {e}")))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Failure("no stdout from the child".into()))?;
        Ok(Self {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// The child's report, its words split; fails if its wall clock is not `skew_secs` off.
    async fn report(&mut self, skew_secs: i64) -> Result<Vec<String>, Failure> {
        let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .map_err(|_| Failure("the skewed client did not answer within 20 s".into()))?
            .map_err(err)?
            .ok_or_else(|| Failure("the skewed client exited without a report".into()))?;
        let words: Vec<String> = line.split_whitespace().map(String::from).collect();
        let clock: i64 = words
            .last()
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| Failure(format!("the skewed client said {line:?}")))?;
        let off = clock - wall_secs();
        ensure!(
            (off - skew_secs).abs() <= 30,
            "the child's clock is {off} s off, not {skew_secs} s: faketime did not take effect"
        );
        Ok(words)
    }

    async fn finish(mut self) -> Outcome {
        drop(self.child.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .map_err(|_| Failure("the skewed client did not exit".into()))?
            .map_err(err)?;
        ensure!(status.success(), "the skewed client ended with {status}");
        Ok(())
    }
}

/// One try by a client `skew_secs` off: its first word (`BUSY` or `GOT`).
async fn try_once(skew_secs: i64, name: &LockName, table: &TableName) -> Result<String, Failure> {
    let mut taker = Skewed::spawn("try", skew_secs, name, table)?;
    let words = taker.report(skew_secs).await?;
    taker.finish().await?;
    Ok(words.first().cloned().unwrap_or_default())
}

/// A holder 10 minutes behind keeps the lock from a client with a right clock past its
/// TTL (the watchdog renews by the server's clock); a taker 10 minutes ahead finds it
/// busy; killed, the skewed holder's lease ends after its TTL by the server's clock, not
/// 10 minutes later; then a holder with a right clock is not taken from by a taker 10
/// minutes ahead, which gets the lock once it is released.
pub(super) async fn never_double_grant() -> Outcome {
    let store = support::MySqlStore::new(Strategy::Lease)
        .await
        .map_err(Failure)?;
    let table = store.config().table_name();
    let name = unique_name("skewed")?;
    let client = super::client(store.config()).await?;

    let mut holder = Skewed::spawn("hold", -SKEW_SECS, &name, &table)?;
    let held = holder.report(-SKEW_SECS).await?;
    ensure!(
        held.first().map(String::as_str) == Some("HELD"),
        "the holder said {held:?}"
    );
    let pid: u32 = held
        .get(2)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| Failure(format!("no pid in {held:?}")))?;
    let held_fence: u64 = held
        .get(1)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| Failure(format!("no fence in {held:?}")))?;
    // Waiting out twice the TTL: the holder's lease is renewed, not expired.
    let waited = client.lock_with(&name, &options().wait(TTL * 2)).await;
    ensure!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "a client with a right clock, waiting {:?}, got {waited:?} from a holder 10 minutes behind",
        TTL * 2
    );
    let taken = try_once(SKEW_SECS, &name, &table).await?;
    ensure!(taken == "BUSY", "a taker 10 minutes ahead said {taken}");

    // Killed without releasing: the lease ends TTL after its last renewal, by the server.
    let killed = Instant::now();
    signal(pid, "KILL")?;
    let _ = holder.child.wait().await;
    let next = client
        .lock_with(&name, &options().wait(TTL * 3))
        .await
        .map_err(|e| Failure(format!("after the skewed holder was killed: {e}")))?;
    let after = killed.elapsed();
    ensure!(
        after <= TTL + Duration::from_secs(1),
        "the killed skewed holder's lease ended {after:?} after the kill (TTL {TTL:?})"
    );
    ensure!(
        next.fence().get() > held_fence,
        "fence {} after {held_fence}",
        next.fence()
    );

    let taken = try_once(SKEW_SECS, &name, &table).await?;
    ensure!(
        taken == "BUSY",
        "a taker 10 minutes ahead said {taken} while the lock was held"
    );
    next.release().await.map_err(err)?;
    let taken = try_once(SKEW_SECS, &name, &table).await?;
    ensure!(
        taken == "GOT",
        "a taker 10 minutes ahead said {taken} for a free lock"
    );
    Ok(())
}
