//! What a scenario is: [`Scenario`], its context [`Ctx`], and its outcome.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use lock_core::{Capabilities, LockClient, LockError, LockGuard, LockName, LockOptions};

use crate::{DelayingBackend, TestStore, holder_process::HolderProcess};

/// The layer [`Ctx::counting_client`] wraps a client's backend in.
pub type CountingBackend = lock_core::layer::Counting<Arc<dyn lock_core::LockBackend>>;

/// A boxed scenario future.
pub type ScenarioFuture = Pin<Box<dyn Future<Output = Outcome> + Send + 'static>>;

/// The result of one scenario: `Ok` or the reason it failed.
pub type Outcome = Result<(), Failure>;

/// Why a scenario failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<LockError> for Failure {
    fn from(error: LockError) -> Self {
        Self(format!("unexpected error: {error}"))
    }
}

/// Fails the scenario with a formatted message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}

/// Whether a scenario applies to a store, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// Run it.
    Yes,
    /// Not applicable, with the reason shown in reports.
    No(&'static str),
}

/// One scenario of the suite.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// Stable name, `group/what`.
    pub name: &'static str,
    /// The contract item it checks (DESIGN.md numbering).
    pub covers: &'static str,
    /// Whether it applies to a store.
    pub applies: fn(&Ctx) -> Applies,
    /// The scenario itself.
    pub run: fn(Ctx) -> ScenarioFuture,
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .finish()
    }
}

/// What a scenario gets: the store, its capabilities and helpers.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) store: Arc<dyn TestStore>,
    pub(crate) caps: Capabilities,
    pub(crate) holder_process: Option<HolderProcess>,
    pub(crate) scenario: &'static str,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("scenario", &self.scenario)
            .finish()
    }
}

impl Ctx {
    /// The store under test.
    pub fn store(&self) -> &Arc<dyn TestStore> {
        &self.store
    }

    /// The backend's declared capabilities.
    pub fn caps(&self) -> &Capabilities {
        &self.caps
    }

    /// A fresh random lock name for this scenario.
    pub fn name(&self, tag: &str) -> LockName {
        let text = format!("ct/{tag}/{:016x}", rand::random::<u64>());
        #[allow(clippy::expect_used)] // tags are short ASCII literals: the name is always valid
        LockName::new(text).expect("scenario names are valid")
    }

    /// A new client (as another process would have).
    pub async fn client(&self) -> Result<LockClient, Failure> {
        Ok(self.store.client().await?)
    }

    /// A new client whose backend counts renewals.
    pub async fn counting_client(&self) -> Result<(LockClient, Arc<CountingBackend>), Failure> {
        let plain = self.client().await?;
        let counting = Arc::new(CountingBackend::new(plain.backend().clone()));
        Ok((LockClient::new(counting.clone()), counting))
    }

    /// A new client whose backend can hold chosen requests back.
    pub async fn delaying_client(&self) -> Result<(LockClient, Arc<DelayingBackend>), Failure> {
        let plain = self.client().await?;
        let delaying = Arc::new(DelayingBackend::new(plain.backend().clone()));
        Ok((LockClient::new(delaying.clone()), delaying))
    }

    /// The store's short TTL.
    pub fn ttl(&self) -> Duration {
        self.store.ttl()
    }

    /// How long the store keeps a dead holder's hold (see [`TestStore::abandoned_hold_lasts`]).
    pub fn abandoned_hold_lasts(&self) -> Duration {
        self.store.abandoned_hold_lasts()
    }

    /// The store's time tolerance.
    pub fn margin(&self) -> Duration {
        self.store.margin()
    }

    /// Options with the short TTL and the given wait budget.
    pub fn options(&self, wait: Duration) -> LockOptions {
        LockOptions::new().ttl(self.ttl()).wait(wait)
    }

    /// Acquires `name` for a holder that never renews (watchdog off): a holder that will stop
    /// without releasing, as a crashed process would.
    pub async fn acquire_unrenewed(
        &self,
        client: &LockClient,
        name: &LockName,
    ) -> Result<LockGuard, Failure> {
        let options = self.options(Duration::ZERO).watchdog(false);
        Ok(client.lock_with(name, &options).await?)
    }

    /// Acquires `name` waiting long enough for an unrenewed lease to expire first.
    pub async fn acquire_after_expiry(
        &self,
        client: &LockClient,
        name: &LockName,
    ) -> Result<LockGuard, Failure> {
        let wait = self.ttl() * 2 + self.margin() * 2;
        Ok(client.lock_with(name, &self.options(wait)).await?)
    }

    /// The median time of one uncontended acquire + release on this store (3 samples).
    pub async fn round_trip(&self) -> Result<Duration, Failure> {
        let client = self.client().await?;
        let mut samples = Vec::new();
        for _ in 0..3 {
            let name = self.name("rtt");
            let start = Instant::now();
            let guard = client
                .lock_with(&name, &self.options(Duration::ZERO))
                .await?;
            guard.release().await?;
            samples.push(start.elapsed());
        }
        samples.sort();
        Ok(samples[1])
    }
}

/// Applies everywhere.
pub(crate) fn always(_: &Ctx) -> Applies {
    Applies::Yes
}

/// Applies to stores whose leases have a TTL.
pub(crate) fn ttl_expiry(ctx: &Ctx) -> Applies {
    if ctx.caps.expiry == lock_core::Expiry::Ttl {
        Applies::Yes
    } else {
        Applies::No("session store: holds end with the session, not a TTL")
    }
}

/// Applies to stores with portable leases.
pub(crate) fn portable(ctx: &Ctx) -> Applies {
    if ctx.caps.portable_lease {
        Applies::Yes
    } else {
        Applies::No("leases are bound to a session or connection")
    }
}

/// Applies where the store can be taken away for a moment.
pub(crate) fn outages(ctx: &Ctx) -> Applies {
    match ctx.store.can_fail() {
        Ok(()) => Applies::Yes,
        Err(why) => Applies::No(why),
    }
}

/// Applies to stores that declare that no waiter starves ([`lock_core::WaitOrder::Fifo`] or
/// [`lock_core::WaitOrder::Fair`]).
pub(crate) fn starvation_free(ctx: &Ctx) -> Applies {
    match ctx.caps.order {
        lock_core::WaitOrder::None => Applies::No("no wait order declared"),
        _ => Applies::Yes,
    }
}

/// Applies to stores that declare FIFO wait order.
pub(crate) fn fifo(ctx: &Ctx) -> Applies {
    if ctx.caps.order == lock_core::WaitOrder::Fifo {
        Applies::Yes
    } else {
        Applies::No("no wait order declared")
    }
}

/// Applies where a separate process can reach the store.
pub(crate) fn cross_process(ctx: &Ctx) -> Applies {
    if !ctx.store.cross_process() {
        Applies::No("in-process store: another process cannot share it")
    } else if ctx.holder_process.is_none() {
        Applies::No("run through the conformance runner to get a holder process")
    } else {
        Applies::Yes
    }
}

/// Applies where the store can hold a value this library did not write.
pub(crate) fn foreign(ctx: &Ctx) -> Applies {
    if ctx.store.can_plant_foreign() {
        Applies::Yes
    } else {
        Applies::No("typed in-process store: nothing foreign can be planted")
    }
}
