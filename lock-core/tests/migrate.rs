//! A migration between two in-process stores, as a mixed fleet lives through it: `old` and
//! `dual` clients, then `dual` alone with the flip in the middle, then `dual` and `new`,
//! contending on a few names. No two holds of a name overlap and fences rise strictly per
//! name across the whole history. The negative controls must be caught: `old` and `new`
//! together (a skipped phase), a "dual" that skips the old store, a flip without the
//! generation bump, and a fail-over composite that tries the second store when the first is
//! busy.

#![allow(clippy::unwrap_used)] // test set-up: a failure is the test's

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use lock_core::{
    Fence, LockBackend, LockClient, LockError, LockOptions, MemoryBackend,
    backend::{AcquireRequest, Grant, async_trait},
    migrate::{Authority, MemoryRecord, MigratingBackend, MigrationRecord, Phase, Record},
};

const NAMES: [&str; 3] = ["m/a", "m/b", "m/c"];

/// What the fleet did wrong: holds of one name that overlapped, fences that did not rise.
#[derive(Debug, Default)]
struct Findings {
    overlaps: usize,
    regressions: usize,
    sections: usize,
}

/// Per name: whether someone is inside, and the last fence that was.
#[derive(Default)]
struct Resource {
    state: Mutex<HashMap<&'static str, (bool, Option<Fence>)>>,
    findings: Mutex<Findings>,
}

impl Resource {
    fn enter(&self, name: &'static str, fence: Fence) {
        let mut state = self.state.lock().unwrap();
        let (inside, last) = state.entry(name).or_default();
        let mut findings = self.findings.lock().unwrap();
        findings.sections += 1;
        if *inside {
            findings.overlaps += 1;
        }
        if last.is_some_and(|last| fence <= last) {
            findings.regressions += 1;
        }
        *inside = true;
        *last = Some(fence);
    }

    fn leave(&self, name: &'static str) {
        if let Some((inside, _)) = self.state.lock().unwrap().get_mut(name) {
            *inside = false;
        }
    }
}

/// `clients` each take every name `rounds` times, holding a moment.
async fn contend(clients: &[LockClient], resource: &Arc<Resource>, rounds: usize) {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10));
    let mut tasks = Vec::new();
    for client in clients {
        let (client, resource, options) = (client.clone(), resource.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let name = NAMES[round % NAMES.len()];
                let guard = client.lock_with(name, &options).await.unwrap();
                resource.enter(name, guard.fence());
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                resource.leave(name);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

struct Stores {
    from: Arc<dyn LockBackend>,
    to: Arc<dyn LockBackend>,
    record: Arc<MemoryRecord>,
}

impl Stores {
    fn new() -> Self {
        Self {
            from: Arc::new(MemoryBackend::new()),
            to: Arc::new(MemoryBackend::new()),
            record: Arc::new(MemoryRecord::new(0)),
        }
    }

    async fn clients(&self, phase: Phase, n: usize) -> Vec<LockClient> {
        let mut out = Vec::new();
        for _ in 0..n {
            let backend = MigratingBackend::new(
                self.from.clone(),
                self.to.clone(),
                self.record.clone(),
                phase,
            )
            .await
            .unwrap();
            out.push(LockClient::new(backend));
        }
        out
    }

    async fn flip(&self) {
        let now = self.record.read().await.unwrap();
        let next = Record {
            authority: Authority::To,
            ..now
        };
        assert!(self.record.advance(&now, &next).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_never_overlaps_and_fences_rise() {
    let stores = Stores::new();
    let resource = Arc::new(Resource::default());
    let old = stores.clients(Phase::Old, 3).await;
    let dual = stores.clients(Phase::Dual, 3).await;
    contend(&[old, dual.clone()].concat(), &resource, 30).await;
    // The old clients are gone (the verified barrier); dual alone, the flip in the middle.
    // The flip once the dual fleet is a third of the way through.
    let flip = async {
        while resource.findings.lock().unwrap().sections < 6 * 30 + 30 {
            tokio::task::yield_now().await;
        }
        stores.flip().await;
    };
    tokio::join!(contend(&dual, &resource, 30), flip);
    let new = stores.clients(Phase::New, 3).await;
    contend(&[dual, new].concat(), &resource, 30).await;
    let findings = resource.findings.lock().unwrap();
    assert_eq!(
        (findings.overlaps, findings.regressions),
        (0, 0),
        "{findings:?}"
    );
    // 6 clients, then 3, then 6, 30 rounds each.
    assert_eq!(findings.sections, (6 + 3 + 6) * 30);
    drop(findings);
    // The last fences are of the generation after the flip.
    for (_, last) in resource.state.lock().unwrap().values() {
        assert!(last.is_some_and(|f| f.get() >> 53 == 1), "{last:?}");
    }
}

#[tokio::test]
async fn phases_that_must_not_start_refuse_to() {
    let stores = Stores::new();
    let early = MigratingBackend::new(
        stores.from.clone(),
        stores.to.clone(),
        stores.record.clone(),
        Phase::New,
    )
    .await;
    assert!(
        matches!(early, Err(LockError::InvalidOptions { .. })),
        "{early:?}"
    );
    stores.flip().await;
    let late = MigratingBackend::new(
        stores.from.clone(),
        stores.to.clone(),
        stores.record.clone(),
        Phase::Old,
    )
    .await;
    assert!(
        matches!(late, Err(LockError::InvalidOptions { .. })),
        "{late:?}"
    );
    let now = stores.record.read().await.unwrap();
    let back = Record {
        authority: Authority::From,
        ..now
    };
    assert!(
        stores.record.advance(&now, &back).await.is_err(),
        "the record went back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_a_phase_is_caught() {
    // `old` clients and clients of the new store alone (a `new` fleet started too early, or a
    // "dual" that skips the old store): nothing makes them exclude each other.
    let stores = Stores::new();
    let resource = Arc::new(Resource::default());
    let old = stores.clients(Phase::Old, 3).await;
    let to_only: Vec<LockClient> = (0..3).map(|_| LockClient::new(stores.to.clone())).collect();
    contend(&[old, to_only].concat(), &resource, 40).await;
    assert!(resource.findings.lock().unwrap().overlaps > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flip_without_the_generation_bump_is_caught() {
    // Authority moved to the new store, but its fences go out as they are: below the old
    // store's, which ran ahead while `old` clients used it alone.
    let stores = Stores::new();
    let resource = Arc::new(Resource::default());
    let old = stores.clients(Phase::Old, 3).await;
    contend(&old, &resource, 30).await;
    let dual = stores.clients(Phase::Dual, 3).await;
    contend(&dual, &resource, 30).await;
    let unbumped: Vec<LockClient> = (0..3).map(|_| LockClient::new(stores.to.clone())).collect();
    contend(&unbumped, &resource, 30).await;
    assert!(resource.findings.lock().unwrap().regressions > 0);
}

/// The fail-over composite: the first store, or the second when the first is busy.
#[derive(Debug)]
struct Failover {
    first: Arc<dyn LockBackend>,
    second: Arc<dyn LockBackend>,
}

#[async_trait]
impl LockBackend for Failover {
    fn capabilities(&self) -> lock_core::Capabilities {
        self.first.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        match self.first.acquire(&request.one_try()).await {
            Err(LockError::Timeout { .. }) => self.second.acquire(request).await,
            other => other,
        }
    }
    async fn renew(&self, lease: &lock_core::Lease, ttl: Duration) -> Result<Grant, LockError> {
        match self.first.renew(lease, ttl).await {
            Err(LockError::NotHeld { .. }) => self.second.renew(lease, ttl).await,
            other => other,
        }
    }
    async fn release(&self, lease: &lock_core::Lease) -> Result<(), LockError> {
        match self.first.release(lease).await {
            Err(LockError::NotHeld { .. }) => self.second.release(lease).await,
            other => other,
        }
    }
    async fn inspect(
        &self,
        name: &lock_core::LockName,
    ) -> Result<Option<lock_core::LockInfo>, LockError> {
        self.first.inspect(name).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_composite_is_caught() {
    let stores = Stores::new();
    let resource = Arc::new(Resource::default());
    let clients: Vec<LockClient> = (0..4)
        .map(|_| {
            LockClient::new(Failover {
                first: stores.from.clone(),
                second: stores.to.clone(),
            })
        })
        .collect();
    contend(&clients, &resource, 40).await;
    assert!(resource.findings.lock().unwrap().overlaps > 0);
}
