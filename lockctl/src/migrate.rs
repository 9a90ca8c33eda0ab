//! `lockctl migrate`: the runbook of a migration between two stores as commands, each
//! refusing to run when its precondition fails (see distributed-lock's README, "Moving locks
//! to another store").

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Subcommand;
use distributed_lock::{
    AdminBackend, LockBackend, LockClient, LockOptions, StoreConfig,
    migrate::{Authority, MigrationRecord, Record},
};
use serde_json::json;

use crate::{Failed, output::Output};

/// One step of a migration.
#[derive(Subcommand)]
pub(crate) enum Step {
    /// Where the migration stands (the record).
    Status {
        /// The record: redis://host:port[?prefix=...] (one server).
        #[arg(long)]
        record: String,
    },
    /// Before deploying `dual`: creates the record (unless it exists), and checks the target
    /// is reachable and writable, the old store can be listed, and the record has not moved.
    Init {
        /// The store locks move from.
        #[arg(long)]
        from: String,
        /// The store locks move to.
        #[arg(long)]
        to: String,
        /// The record.
        #[arg(long)]
        record: String,
    },
    /// Before the flip: over SOAK, no lock is held in FROM without its twin in TO (a holder
    /// there without one, still alone 20 ms later, is an `old` client still running).
    Verify {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        /// How long to watch.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        soak: Duration,
    },
    /// Moves authority to the target: fences move to the next generation. Then deploy `new`.
    Flip {
        #[arg(long)]
        record: String,
    },
    /// After `new` everywhere: authority is the target's and, over SOAK, nothing is held in
    /// FROM (no `dual` client is left); the old store's lock data may then go.
    Finish {
        #[arg(long)]
        from: String,
        #[arg(long)]
        record: String,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        soak: Duration,
    },
}

fn refused(why: String) -> Failed {
    Failed(format!("refused: {why}"))
}

/// The store at `url`, connected (with the operator's view).
async fn store(url: &str) -> Result<Arc<dyn AdminBackend>, Failed> {
    let config: StoreConfig = url.parse()?;
    Ok(config.backend().await?)
}

/// The locks held in `store`, with a fingerprint of each holder.
async fn holders(store: &dyn AdminBackend) -> Result<BTreeMap<String, String>, Failed> {
    Ok(store
        .list("")
        .await?
        .into_iter()
        .map(|h| (h.name.as_str().to_owned(), h.holder))
        .collect())
}

async fn held_names(url: &str) -> Result<BTreeSet<String>, Failed> {
    Ok(holders(&*store(url).await?).await?.into_keys().collect())
}

/// Watches for `soak`: the names `check` finds wrong, every 200 ms.
async fn watch<F, Fut>(soak: Duration, mut check: F) -> Result<BTreeSet<String>, Failed>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<BTreeSet<String>, Failed>>,
{
    let until = Instant::now() + soak;
    let mut seen = BTreeSet::new();
    loop {
        seen.extend(check().await?);
        if Instant::now() >= until {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long after seeing a lock held in the old store alone `verify` looks again.
const RECHECK: Duration = Duration::from_millis(20);

/// Over `soak`, every 200 ms, the locks held in `from` without a twin in `to`, and still so,
/// by the same holder, [`RECHECK`] later. A `dual` client holds `from` alone only between its
/// two acquisitions or its two releases (a round trip to `to`); an `old` client holds it
/// alone for its whole hold. Holds shorter than [`RECHECK`] go unseen: evidence, not proof.
async fn old_only(from: &str, to: &str, soak: Duration) -> Result<BTreeSet<String>, Failed> {
    let (from, to) = (store(from).await?, store(to).await?);
    let alone = || async {
        let in_from = holders(&*from).await?;
        let in_to = holders(&*to).await?;
        Ok::<BTreeMap<String, String>, Failed>(
            in_from
                .into_iter()
                .filter(|(name, _)| !in_to.contains_key(name))
                .collect(),
        )
    };
    let until = Instant::now() + soak;
    let mut found = BTreeSet::new();
    loop {
        let first = alone().await?;
        if !first.is_empty() {
            tokio::time::sleep(RECHECK).await;
            let again = alone().await?;
            found.extend(
                first
                    .into_iter()
                    .filter(|(name, holder)| again.get(name) == Some(holder))
                    .map(|(name, _)| name),
            );
        }
        if Instant::now() >= until {
            return Ok(found);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn record_json(record: &Record) -> serde_json::Value {
    json!({
        "generation": record.generation,
        "authority": match record.authority { Authority::From => "from", Authority::To => "to" },
        "fence_generation": record.fence_generation(),
    })
}

pub(crate) async fn run(step: Step, out: &Output) -> Result<(), Failed> {
    match step {
        Step::Status { record } => {
            let now = distributed_lock::migration_record(&record)
                .await?
                .read()
                .await?;
            out.migration("status", &record_json(&now));
        }
        Step::Init { from, to, record } => init(&from, &to, &record, out).await?,
        Step::Verify { from, to, soak } => {
            let old_only = old_only(&from, &to, soak).await?;
            if !old_only.is_empty() {
                return Err(refused(format!(
                    "held in the old store without a twin in the new one (old clients still \
                     run): {}",
                    old_only.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            let soak_ms = u64::try_from(soak.as_millis()).unwrap_or(u64::MAX);
            out.migration("verify", &json!({ "old_only": 0, "soak_ms": soak_ms }));
        }
        Step::Flip { record } => flip(&record, out).await?,
        Step::Finish { from, record, soak } => {
            let now = distributed_lock::migration_record(&record)
                .await?
                .read()
                .await?;
            if now.authority != Authority::To {
                return Err(refused(
                    "not flipped yet: authority is the old store's".into(),
                ));
            }
            // One connection for the whole soak.
            let old = &store(&from).await?;
            let still = watch(soak, move || async move {
                Ok(holders(&**old).await?.into_keys().collect())
            })
            .await?;
            if !still.is_empty() {
                return Err(refused(format!(
                    "still held in the old store (dual clients still run): {}",
                    still.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            out.migration(
                "finish",
                &json!({ "done": true, "record": record_json(&now) }),
            );
        }
    }
    Ok(())
}

/// `init`: the record is created (unless it exists) and has not moved, the old store can be
/// listed, and the target takes a lock and gives it back.
async fn init(from: &str, to: &str, record: &str, out: &Output) -> Result<(), Failed> {
    let now = distributed_lock::migration_record(record)
        .await?
        .start()
        .await?;
    if now.authority != Authority::From {
        return Err(refused(format!("the record has moved already: {now:?}")));
    }
    held_names(from).await?;
    let target: StoreConfig = to.parse()?;
    let backend: Arc<dyn LockBackend> = target.backend().await?;
    let probe = LockClient::new(backend)
        .lock_with("lockctl-migrate/probe", &LockOptions::new())
        .await?;
    probe.release().await?;
    out.migration(
        "init",
        &json!({ "ready": true, "record": record_json(&now) }),
    );
    Ok(())
}

/// `flip`: authority to the target, once.
async fn flip(record: &str, out: &Output) -> Result<(), Failed> {
    let store: Arc<dyn MigrationRecord> = distributed_lock::migration_record(record).await?;
    let now = store.read().await?;
    if now.authority != Authority::From {
        return Err(refused(format!("already flipped: {now:?}")));
    }
    let next = Record {
        authority: Authority::To,
        ..now
    };
    if !store.advance(&now, &next).await? {
        return Err(refused("the record moved meanwhile; look again".into()));
    }
    out.migration("flip", &record_json(&next));
    Ok(())
}
