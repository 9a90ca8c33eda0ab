//! `lockctl hold`: takes a lock and holds it, renewing, until Ctrl-C (then releases it) or
//! until it is lost (exit code 3).

use std::{process::ExitCode, time::Duration};

use distributed_lock::{LockBackend, LockClient, LockName, LockOptions, StoreConfig};
use tokio::signal::unix::{SignalKind, signal};

use crate::{Failed, output::Output};

/// The exit code when the held lock was lost.
const LOST: u8 = 3;

pub(crate) async fn run(
    config: &StoreConfig,
    name: &LockName,
    ttl: Duration,
    wait: Duration,
    out: &Output,
) -> Result<ExitCode, Failed> {
    // Listening for Ctrl-C (SIGINT) from before the lock is taken: one that comes as soon as
    // "held" is printed still releases it.
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| Failed(format!("listening for Ctrl-C: {e}")))?;
    let backend: std::sync::Arc<dyn LockBackend> = config.backend().await?;
    let client = LockClient::new(backend);
    let guard = client
        .lock_with(name, &LockOptions::new().ttl(ttl).wait(wait))
        .await?;
    out.holding(name, &guard);
    tokio::select! {
        reason = guard.lost() => {
            out.lost(name, reason);
            Ok(ExitCode::from(LOST))
        }
        _ = interrupt.recv() => {
            guard.release().await?;
            out.released(name);
            Ok(ExitCode::SUCCESS)
        }
    }
}
