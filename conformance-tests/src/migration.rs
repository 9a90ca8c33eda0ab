//! The proof of a migration between two stores ([`lock_core::migrate`]): a mixed fleet lives
//! through it and a fenced resource judges it ([`mixed_fleet`]), and negative controls the
//! same judge must catch ([`skipped_phase`], [`flip_without_bump`], [`failover_composite`]);
//! a dual acquisition dropped between its two stores gives the first back
//! ([`dropped_dual_gives_back_from`]).
//!
//! The fleet, in the order a rolling migration runs: `old` and `dual` clients together; `dual`
//! alone, the flip a third of the way through; `dual` and `new` together. Holds are short
//! (300 µs against a 10 s TTL): renewals, lost sides and end signals are not exercised here. Each client takes a few names in
//! turn and holds each a moment. Judged: no two holds of a name overlap, and fences rise
//! strictly per name across the whole history.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use lock_core::{
    Capabilities, Fence, Lease, LockBackend, LockClient, LockError, LockInfo, LockName,
    LockOptions,
    backend::{AcquireRequest, Grant},
    migrate::{Authority, MigratingBackend, MigrationRecord, Phase, Record},
};

use crate::{Failure, Outcome, ensure};

/// The two stores of a migration and its record.
#[derive(Clone, Debug)]
pub struct Stores {
    /// Where locks move from.
    pub from: Arc<dyn LockBackend>,
    /// Where locks move to.
    pub to: Arc<dyn LockBackend>,
    /// The migration's record (at authority `from`).
    pub record: Arc<dyn MigrationRecord>,
}

/// What a fleet did wrong.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Findings {
    /// Holds of one name that overlapped.
    pub overlaps: usize,
    /// Grants whose fence was not above the previous holder's.
    pub regressions: usize,
    /// Critical sections in all.
    pub sections: usize,
}

/// The fenced resource: per name, whether someone is inside and the last fence that was.
#[derive(Default)]
struct Resource {
    state: Mutex<HashMap<String, (bool, Option<Fence>)>>,
    findings: Mutex<Findings>,
}

impl Resource {
    fn enter(&self, name: &str, fence: Fence) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (inside, last) = state.entry(name.to_owned()).or_default();
        let mut findings = self.findings.lock().unwrap_or_else(PoisonError::into_inner);
        findings.sections += 1;
        findings.overlaps += usize::from(*inside);
        findings.regressions += usize::from(last.is_some_and(|last| fence <= last));
        *inside = true;
        *last = Some(fence);
    }

    fn leave(&self, name: &str) {
        if let Some((inside, _)) = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(name)
        {
            *inside = false;
        }
    }

    fn findings(&self) -> Findings {
        *self.findings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How long a negative control's clients hold each lock: long enough that clients that do
/// not exclude each other meet.
const CONTROL_HOLD: Duration = Duration::from_millis(5);

/// How long the fail-over control's clients hold each lock. Two of them meet only when one's
/// single try on the first store is refused while another holds it there, and its acquisition
/// on the second store lands before that hold ends: a first hold on a row-lock name opens a
/// transaction and writes a fence, a few milliseconds, longer on a loaded machine. With
/// [`CONTROL_HOLD`], a run of `cargo xtask test` saw no overlap in 24 rounds of
/// `mysql-lease -> mysql-rowlock` (one fence going back, so the second store was used), where
/// 20 runs of that pair alone on an idle machine all met.
const FAILOVER_HOLD: Duration = Duration::from_millis(25);

/// The names a fleet contends for (fresh for each run).
fn names(tag: &str) -> Vec<String> {
    let run = rand::random::<u32>();
    (0..3)
        .map(|i| format!("migration/{tag}/{run:08x}/{i}"))
        .collect()
}

/// `clients` each take `names` in turn, `rounds` times in all.
async fn contend(
    clients: &[LockClient],
    names: &[String],
    resource: &Arc<Resource>,
    rounds: usize,
) -> Outcome {
    contend_holding(clients, names, resource, rounds, Duration::from_micros(300)).await
}

/// [`contend`], each hold lasting `hold` (longer in the negative controls, so that clients
/// that do not exclude each other meet).
async fn contend_holding(
    clients: &[LockClient],
    names: &[String],
    resource: &Arc<Resource>,
    rounds: usize,
    hold: Duration,
) -> Outcome {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(20));
    let mut tasks = Vec::new();
    for client in clients {
        let (client, resource, options) = (client.clone(), resource.clone(), options.clone());
        let names = names.to_vec();
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let name = &names[round % names.len()];
                let guard = client.lock_with(name.as_str(), &options).await?;
                resource.enter(name, guard.fence());
                tokio::time::sleep(hold).await;
                resource.leave(name);
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure(format!("a fleet client: {e}")))?
            .map_err(|e| Failure(format!("a fleet client: {e}")))?;
    }
    Ok(())
}

async fn clients(stores: &Stores, phase: Phase, n: usize) -> Result<Vec<LockClient>, Failure> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let backend = MigratingBackend::new(
            stores.from.clone(),
            stores.to.clone(),
            stores.record.clone(),
            phase,
        )
        .await?;
        out.push(LockClient::new(backend));
    }
    Ok(out)
}

/// Moves `record` to authority `to`.
///
/// # Errors
/// When the record is not at authority `from`, or cannot be moved.
pub async fn flip(record: &dyn MigrationRecord) -> Outcome {
    let now = record.read().await?;
    let next = Record {
        authority: Authority::To,
        ..now
    };
    ensure!(
        record.advance(&now, &next).await?,
        "the record moved under the flip"
    );
    Ok(())
}

/// The whole migration as a mixed fleet lives through it (see the module's docs); what the
/// resource found. The flip happens once the dual fleet is a third of the way through its
/// phase.
///
/// # Errors
/// A client failing (a lock not granted within 20 s, a store error), or a phase refusing to
/// start.
pub async fn mixed_fleet(stores: &Stores, rounds: usize) -> Result<Findings, Failure> {
    let names = names("fleet");
    let resource = Arc::new(Resource::default());
    let old = clients(stores, Phase::Old, 2).await?;
    let dual = clients(stores, Phase::Dual, 2).await?;
    contend(&[old, dual.clone()].concat(), &names, &resource, rounds).await?;
    let before = resource.findings().sections;
    let flip_midway = async {
        while resource.findings().sections < before + rounds * 2 / 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        flip(stores.record.as_ref()).await
    };
    // A fleet that fails ends the wait for the flip too.
    tokio::try_join!(contend(&dual, &names, &resource, rounds), flip_midway)?;
    let new = clients(stores, Phase::New, 2).await?;
    contend(&[dual, new].concat(), &names, &resource, rounds).await?;
    Ok(resource.findings())
}

/// Negative control: `old` clients and clients of the new store alone (a skipped phase, or a
/// "dual" that skips the old store) run together.
///
/// # Errors
/// A client failing.
pub async fn skipped_phase(stores: &Stores, rounds: usize) -> Result<Findings, Failure> {
    let names = names("skipped");
    let resource = Arc::new(Resource::default());
    let mut fleet = clients(stores, Phase::Old, 2).await?;
    fleet.extend((0..2).map(|_| LockClient::new(stores.to.clone())));
    contend_holding(&fleet, &names, &resource, rounds, CONTROL_HOLD).await?;
    Ok(resource.findings())
}

/// Negative control: `old` clients run the old store ahead, then authority moves to the new
/// store without the generation bump (its fences go out as they are). Fences then go back
/// where the new store's own fences start below the old store's; where they start above
/// (Redis's microsecond fences after a MySQL counter) the order is luck, which is why the
/// bump is the contract. The answer says which: the findings, and whether the new store's
/// first fence was below the old store's last.
///
/// # Errors
/// A client failing.
pub async fn flip_without_bump(
    stores: &Stores,
    rounds: usize,
) -> Result<(Findings, bool), Failure> {
    let names = names("unbumped");
    let resource = Arc::new(Resource::default());
    let old = clients(stores, Phase::Old, 2).await?;
    contend(&old, &names, &resource, rounds).await?;
    let last_old = resource
        .state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&names[0])
        .and_then(|(_, last)| *last);
    let probe = LockClient::new(stores.to.clone())
        .lock_with(names[0].as_str(), &LockOptions::new())
        .await?;
    let below = last_old.is_some_and(|last| probe.fence() < last);
    probe.release().await?;
    let unbumped: Vec<LockClient> = (0..2).map(|_| LockClient::new(stores.to.clone())).collect();
    contend(&unbumped, &names, &resource, rounds).await?;
    Ok((resource.findings(), below))
}

/// The fail-over composite: the first store, or the second when the first is busy.
#[derive(Debug)]
struct Failover {
    first: Arc<dyn LockBackend>,
    second: Arc<dyn LockBackend>,
}

#[async_trait]
impl LockBackend for Failover {
    fn capabilities(&self) -> Capabilities {
        self.first.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        match self.first.acquire(&request.one_try()).await {
            Err(LockError::Timeout { .. }) => self.second.acquire(request).await,
            other => other,
        }
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        match self.first.renew(lease, ttl).await {
            Err(LockError::NotHeld { .. }) => self.second.renew(lease, ttl).await,
            other => other,
        }
    }
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        match self.first.release(lease).await {
            Err(LockError::NotHeld { .. }) => self.second.release(lease).await,
            other => other,
        }
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.first.inspect(name).await
    }
}

/// Negative control: clients of a fail-over composite over the two stores.
///
/// # Errors
/// A client failing.
pub async fn failover_composite(stores: &Stores, rounds: usize) -> Result<Findings, Failure> {
    let names = names("failover");
    let resource = Arc::new(Resource::default());
    let fleet: Vec<LockClient> = (0..4)
        .map(|_| {
            LockClient::new(Failover {
                first: stores.from.clone(),
                second: stores.to.clone(),
            })
        })
        .collect();
    contend_holding(&fleet, &names, &resource, rounds, FAILOVER_HOLD).await?;
    Ok(resource.findings())
}

/// A dual acquisition that holds `from` and waits for `to` is dropped (as a process killed
/// between its two acquisitions would stop): `from` is free again within `limit`. The lease
/// is short (2 s): the drop may land while `from`'s own acquisition is still finishing (its
/// grant already visible), and then that store's cancel safety frees it within its TTL.
///
/// # Errors
/// When `from` stays held for `limit`.
pub async fn dropped_dual_gives_back_from(stores: &Stores, limit: Duration) -> Outcome {
    let name = LockName::new(format!("migration/dropped/{:08x}", rand::random::<u32>()))?;
    let to_holder = LockClient::new(stores.to.clone());
    let blocker = to_holder.lock_with(&name, &LockOptions::new()).await?;
    let dual = clients(stores, Phase::Dual, 1).await?.remove(0);
    let pending = {
        let name = name.clone();
        tokio::spawn(async move {
            let options = LockOptions::new()
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(30));
            dual.lock_with(&name, &options).await
        })
    };
    let start = Instant::now();
    while stores.from.inspect(&name).await?.is_none() {
        ensure!(
            start.elapsed() < limit,
            "the dual acquisition never took `from`"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pending.abort();
    let _ = pending.await;
    let start = Instant::now();
    while stores.from.inspect(&name).await?.is_some() {
        ensure!(
            start.elapsed() < limit,
            "`from` stayed held {limit:?} after its dual acquisition was dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    blocker.release().await?;
    Ok(())
}
