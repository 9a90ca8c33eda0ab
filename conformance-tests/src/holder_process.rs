//! Child processes of a test binary, and the killed-holder protocol built on them.
//!
//! A test binary re-executes itself as a child with [`ROLE_VAR`] set ([`child`]); its `main`
//! asks [`role`] first and plays that role instead of running its tests. The conformance
//! runner's holder (role [`HOLDER_ROLE`]) is one such role: both sides of its protocol live
//! here. The parent ([`HolderProcess::spawn`]) starts it with the store label, the lock name
//! and a TTL; the child ([`serve`]) acquires the lock, prints `HELD <fence>` and keeps it
//! (the watchdog renewing) until it is killed. Fault tests use [`child`] and [`role`] for
//! roles of their own.

use std::{path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use lock_core::{LockName, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::TestStore;

/// The variable that names the role a test binary was re-executed in.
pub const ROLE_VAR: &str = "LOCK_TEST_CHILD_ROLE";
/// The role of the conformance runner's holder process.
pub const HOLDER_ROLE: &str = "conformance-holder";
/// Names the store a holder process builds.
pub const HOLDER_STORE_VAR: &str = "LOCK_CONFORMANCE_HOLDER_STORE";
/// The lock a holder process acquires.
pub const HOLDER_NAME_VAR: &str = "LOCK_CONFORMANCE_HOLDER_NAME";
/// The TTL, in milliseconds, a holder process acquires with.
pub const HOLDER_TTL_VAR: &str = "LOCK_CONFORMANCE_HOLDER_TTL_MS";

/// How long a holder process lives at most if nobody kills it.
const HOLDER_LIFETIME: Duration = Duration::from_secs(120);
/// How long the parent waits for the child's `HELD` line.
const HELD_WITHIN: Duration = Duration::from_secs(30);

/// The role this process was started in by [`child`], if it was.
pub fn role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

/// A command that runs this test binary again in `role`: stdin closed, stdout piped (the
/// child reports there), stderr inherited, killed when dropped. Add the role's own variables
/// and spawn it.
///
/// # Errors
/// When the path of the running executable cannot be found.
pub fn child(role: &str) -> Result<tokio::process::Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    Ok(command(&exe, role))
}

/// [`child`] with its wall clock `offset_secs` seconds off, run under `faketime` (the
/// program at the path `faketime`, which `cargo xtask services up` installs): only the wall
/// clock is off (the monotonic clock, which `Instant` and the timers read, stays right, as on
/// a real machine), in libfaketime's thread-safe variant.
///
/// # Errors
/// When the path of the running executable cannot be found.
pub fn child_with_clock(
    role: &str,
    faketime: &str,
    offset_secs: i64,
) -> Result<tokio::process::Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let mut command = tokio::process::Command::new(faketime);
    command
        .args(["-m", "--exclude-monotonic", "-f"])
        .arg(format!("{offset_secs:+}s"))
        .arg(exe)
        .env(ROLE_VAR, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    Ok(command)
}

/// `exe` in `role`, with the stdio and kill-on-drop of every child role.
fn command(exe: &std::path::Path, role: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(exe);
    command
        .env(ROLE_VAR, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    command
}

/// How to start a separate holder process (the runner's own executable in holder mode).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HolderProcess {
    /// The executable.
    pub exe: PathBuf,
    /// The store label the child builds.
    pub store: String,
}

/// A running holder process and the fence of the hold it reported.
#[derive(Debug)]
pub struct HeldByChild {
    /// The child; killing it (or dropping this) ends the process.
    pub child: tokio::process::Child,
    /// The fence the child's guard got.
    pub fence: u64,
}

impl HolderProcess {
    /// A holder process of `exe` that builds the store labelled `store`.
    pub fn new(exe: PathBuf, store: impl Into<String>) -> Self {
        Self {
            exe,
            store: store.into(),
        }
    }

    /// The parent's side: starts the holder on `name` with `ttl` and waits (up to 30 s) for
    /// its `HELD <fence>` line.
    ///
    /// # Errors
    /// When the child cannot start, says something else, or says nothing in time.
    ///
    /// # Cancel safety
    /// Dropping the future kills the child.
    pub async fn spawn(&self, name: &LockName, ttl: Duration) -> Result<HeldByChild, String> {
        let mut child = command(&self.exe, HOLDER_ROLE)
            .env(HOLDER_STORE_VAR, &self.store)
            .env(HOLDER_NAME_VAR, name.as_str())
            .env(HOLDER_TTL_VAR, ttl.as_millis().to_string())
            .spawn()
            .map_err(|e| format!("cannot start the holder process: {e}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or("the holder process has no stdout")?;
        let mut line = String::new();
        tokio::time::timeout(HELD_WITHIN, BufReader::new(stdout).read_line(&mut line))
            .await
            .map_err(|_| format!("the holder process did not report within {HELD_WITHIN:?}"))?
            .map_err(|e| format!("reading the holder process: {e}"))?;
        let fence = line
            .strip_prefix("HELD ")
            .and_then(|f| f.trim().parse().ok())
            .ok_or_else(|| format!("the holder process said {line:?}"))?;
        Ok(HeldByChild { child, fence })
    }
}

/// The child's side: reads the lock name and TTL the parent set, acquires the lock from
/// `store`, prints `HELD <fence>` and holds it until killed (giving up after two minutes).
///
/// # Errors
/// A missing or malformed variable, or a failure to acquire.
pub async fn serve(store: Arc<dyn TestStore>) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).map_err(|e| format!("{name}: {e}"));
    let name = LockName::new(var(HOLDER_NAME_VAR)?).map_err(|e| e.to_string())?;
    let ttl: u64 = var(HOLDER_TTL_VAR)?
        .parse()
        .map_err(|e| format!("{HOLDER_TTL_VAR}: {e}"))?;
    let client = store.client().await.map_err(|e| e.to_string())?;
    let options = LockOptions::new()
        .ttl(Duration::from_millis(ttl))
        .wait(Duration::from_secs(30));
    let guard = client
        .lock_with(&name, &options)
        .await
        .map_err(|e| e.to_string())?;
    println!("HELD {}", guard.fence());
    // Hold (the watchdog renews) until killed; give up after a while if nobody does.
    tokio::time::sleep(HOLDER_LIFETIME).await;
    guard.release().await.map_err(|e| e.to_string())
}
