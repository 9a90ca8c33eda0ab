//! Contracts 4 and 7 across processes: a holder killed with SIGKILL loses the lock within its
//! TTL (session stores: its session timeout).

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{Ctx, Failure, Outcome, ensure, runner};

/// A separate process holds the lock (watchdog renewing), is killed with SIGKILL, and another
/// client gets the lock within the TTL, with a larger fence.
pub(crate) async fn killed_holder_process_loses_lock(ctx: Ctx) -> Outcome {
    let Some(process) = ctx.holder_process.clone() else {
        return Err(Failure("no holder process available".into()));
    };
    let name = ctx.name("killed");
    let ttl = ctx.ttl();
    let mut child = tokio::process::Command::new(&process.exe)
        .env(runner::HOLDER_STORE_VAR, &process.store)
        .env(runner::HOLDER_NAME_VAR, name.as_str())
        .env(runner::HOLDER_TTL_VAR, ttl.as_millis().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Failure(format!("cannot start the holder process: {e}")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Failure("the holder process has no stdout".into()))?;
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .map_err(|_| Failure("the holder process did not report within 30 s".into()))?
    .map_err(|e| Failure(format!("reading the holder process: {e}")))?;
    let child_fence: u64 = line
        .strip_prefix("HELD ")
        .and_then(|f| f.trim().parse().ok())
        .ok_or_else(|| Failure(format!("the holder process said {line:?}")))?;
    let client = ctx.client().await?;
    let busy = client
        .try_lock_with(&name, &ctx.options(Duration::ZERO))
        .await?;
    ensure!(
        busy.is_none(),
        "the lock was free while the holder process lived"
    );
    child
        .kill()
        .await
        .map_err(|e| Failure(format!("cannot SIGKILL the holder process: {e}")))?;
    let killed = Instant::now();
    let lasts = ctx.abandoned_hold_lasts();
    let guard = client
        .lock_with(&name, &ctx.options(lasts * 3 + ctx.margin()))
        .await?;
    let took = killed.elapsed();
    ensure!(
        took <= lasts + ctx.margin(),
        "the lock was free only {took:?} after its holder was killed (the store keeps a dead holder's hold {lasts:?})"
    );
    ensure!(
        guard.fence().get() > child_fence,
        "fence {} after the killed holder's {child_fence}",
        guard.fence()
    );
    guard.release().await?;
    Ok(())
}
