//! One worker process: contends for the campaign's locks until its end time, recording each
//! critical section on standard output ([`Record`], one JSON line each, flushed at once).
//!
//! A turn: pick a lock, `acquire` with the wait budget; on a grant record it, hold a random
//! 0-50 ms racing `lost()`, and unless `lost()` won, write its fence to the fenced resource
//! (noting whether it still saw the lock held); then record the end and release.

use std::{io::Write as _, time::Duration};

use conformance_tests::faults::signal;
use lock_core::{LockClient, LockError, LockOptions};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::{Nanos, Record, Section, WorkerEnd, clock, server::Writer, stores};

/// What one worker does.
#[derive(Debug, Clone)]
pub struct Job {
    /// The store (one of [`stores::STORES`]).
    pub store: String,
    /// This worker's id (unique in the campaign; a restarted worker gets a new one).
    pub id: u32,
    /// The lock names it contends for.
    pub names: Vec<String>,
    /// The lease TTL.
    pub ttl: Duration,
    /// The wait budget of each acquire.
    pub wait: Duration,
    /// When it stops (monotonic nanoseconds).
    pub until: Nanos,
    /// The fenced resource's address.
    pub resource: String,
    /// The seed of its random choices.
    pub seed: u64,
    /// How often (per mille of its writes) it freezes itself (`SIGSTOP`) after deciding to
    /// write and before the write goes out, as a process does in a long GC pause; the
    /// campaign continues it later. This is the case fences are for.
    pub pause_writes: u32,
}

/// The kind of an error, for counting: its variant's name.
fn kind(error: &LockError) -> String {
    let debug = format!("{error:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Unknown")
        .to_owned()
}

fn emit(record: &Record) -> Result<(), String> {
    let line = serde_json::to_string(record).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())
}

/// Runs `job` to its end.
///
/// # Errors
/// When the store or the resource cannot be reached at the start, or standard output fails.
pub async fn run(job: &Job) -> Result<(), String> {
    let client = stores::connect(&job.store).await?;
    let mut resource = Writer::connect(&job.resource).await?;
    let mut rng = StdRng::seed_from_u64(job.seed ^ (u64::from(job.id) << 32));
    let mut end = WorkerEnd {
        worker: job.id,
        ..WorkerEnd::default()
    };
    let options = LockOptions::new().ttl(job.ttl).wait(job.wait);
    while clock::now() < job.until && !job.names.is_empty() {
        let name = &job.names[rng.random_range(0..job.names.len())];
        turn(
            &client,
            job,
            name,
            &options,
            &mut rng,
            &mut resource,
            &mut end,
        )
        .await?;
    }
    emit(&Record::Done(end))
}

async fn turn(
    client: &LockClient,
    job: &Job,
    name: &str,
    options: &LockOptions,
    rng: &mut StdRng,
    resource: &mut Writer,
    end: &mut WorkerEnd,
) -> Result<(), String> {
    let called = clock::now();
    let guard = match client.lock_with(name, options).await {
        Ok(guard) => guard,
        Err(LockError::Timeout { .. }) => {
            *end.errors.entry("Timeout".into()).or_default() += 1;
            return Ok(());
        }
        Err(error) => {
            *end.errors.entry(kind(&error)).or_default() += 1;
            return Ok(());
        }
    };
    let acquired = clock::now();
    let fence = guard.fence().get();
    let ttl = u64::try_from(guard.lease().ttl().as_nanos()).unwrap_or(u64::MAX);
    emit(&Record::Grant(Section {
        name: name.to_owned(),
        worker: job.id,
        fence,
        called,
        acquired,
        held_seen: None,
        ended: None,
        ttl,
    }))?;
    let hold = Duration::from_millis(rng.random_range(0..=50));
    let lost = tokio::time::timeout(hold, guard.lost()).await.ok();
    let mut held_seen = None;
    if lost.is_none() {
        // The sleep won the race: the worker goes on to write, as a service would once its
        // work is done. Whether it still sees the lock held is recorded (a trusted overlap
        // is one seen held after a newer grant); the write goes out either way, and only
        // the fence can stop a stale one.
        // The time is read before asking: a pause between the answer and a clock read
        // after it would date the answer late.
        let asked = clock::now();
        if guard.is_held() {
            held_seen = Some(asked);
        }
        // Drawn every time, so the seed fixes the draws; never after the end, when nobody
        // continues frozen workers any more.
        let freeze = rng.random_range(0..1000) < job.pause_writes;
        if freeze && clock::now() < job.until {
            signal(std::process::id(), "STOP").map_err(|f| f.0)?;
        }
        resource.write(name, fence, job.id).await?;
    }
    if let Some(reason) = lost {
        *end.lost.entry(format!("{reason:?}")).or_default() += 1;
    }
    let ended = clock::now();
    emit(&Record::End {
        worker: job.id,
        name: name.to_owned(),
        fence,
        held_seen,
        ended,
    })?;
    if let Err(error) = guard.release().await
        && lost.is_none()
    {
        *end.errors
            .entry(format!("release {}", kind(&error)))
            .or_default() += 1;
    }
    Ok(())
}
