//! [`Runner`]: the `main` of every backend's conformance test binary, and [`run_suite`].
//!
//! A backend's `tests/conformance.rs` (with `harness = false`) is one call:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     conformance_tests::Runner::new()
//!         .store("memory", || async { Ok(conformance_tests::MemoryStore::new()) })
//!         .main()
//! }
//! ```
//!
//! The same executable is the holder process of the killed-holder scenario: started in the
//! role [`HOLDER_ROLE`](crate::holder_process::HOLDER_ROLE), it builds the store named by
//! [`HOLDER_STORE_VAR`] and serves as [`holder_process::serve`] says.

use std::{
    future::Future,
    path::PathBuf,
    pin::Pin,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    Applies, Ctx, ScenarioResult, SuiteReport, TestStore, Verdict,
    holder_process::{self, HOLDER_ROLE, HOLDER_STORE_VAR, HolderProcess},
    scenarios,
};

/// Where JSON reports go (one file per store), when set.
pub const REPORT_DIR_VAR: &str = "LOCK_CONFORMANCE_REPORT_DIR";

/// How long one scenario may run before it counts as hung.
const SCENARIO_LIMIT: Duration = Duration::from_secs(90);

type StoreFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn TestStore>, String>> + Send>>;
type Factory = Arc<dyn Fn() -> StoreFuture + Send + Sync>;

/// Runs the suite against the stores a backend's test registers.
#[derive(Default)]
pub struct Runner {
    stores: Vec<(String, Factory)>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<_> = self.stores.iter().map(|(l, _)| l).collect();
        f.debug_struct("Runner").field("stores", &labels).finish()
    }
}

impl Runner {
    /// A runner with no stores.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a store under `label` (a column of `cargo xtask compare`). The factory
    /// returns an error message when the store cannot be reached (an unset or unanswering
    /// server variable): that is reported as a failure, never skipped.
    pub fn store<S, F, Fut>(mut self, label: &str, factory: F) -> Self
    where
        S: TestStore,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, String>> + Send + 'static,
    {
        let factory: Factory = Arc::new(move || {
            let made = factory();
            Box::pin(async move { made.await.map(|s| Arc::new(s) as Arc<dyn TestStore>) })
        });
        self.stores.push((label.to_owned(), factory));
        self
    }

    /// Runs the suite (or, in a holder process, holds a lock until killed) and returns the
    /// exit code: failure when any scenario of any store failed.
    ///
    /// Command-line arguments that do not start with `-` filter scenarios by substring.
    pub fn main(self) -> ExitCode {
        crate::main_with(async move {
            if holder_process::role().as_deref() == Some(HOLDER_ROLE) {
                self.hold().await
            } else {
                self.run().await
            }
        })
    }

    async fn run(self) -> Result<(), String> {
        let filter: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        let exe = std::env::current_exe().ok();
        let report_dir = std::env::var_os(REPORT_DIR_VAR).map(PathBuf::from);
        let (mut passed, mut failed, mut not_applicable) = (0, 0, 0);
        // Repeated at the end: CI logs keep a run's tail, and a long suite's failures scroll
        // far above it.
        let mut failure_lines = Vec::new();
        for (label, factory) in &self.stores {
            if !crate::selection::selected(label) {
                println!("`{label}` not selected ({})", crate::selection::ONLY_VAR);
                continue;
            }
            println!("conformance suite on `{label}`");
            let report = match factory().await {
                Ok(store) => {
                    let holder = exe.clone().map(|exe| HolderProcess::new(exe, label));
                    run_suite(label, store, holder, &filter).await
                }
                Err(error) => {
                    println!("  FAIL  `{label}` could not be set up: {error}");
                    SuiteReport {
                        store: label.clone(),
                        url: String::new(),
                        capabilities: None,
                        error: Some(error),
                        results: Vec::new(),
                    }
                }
            };
            if let Some(dir) = &report_dir
                && let Err(e) = report.write_json(dir)
            {
                let line = format!("{label}: cannot write the report to {}: {e}", dir.display());
                println!("  {line}");
                failure_lines.push(line);
                failed += 1;
            }
            println!(
                "  `{label}`: {} passed, {} failed, {} not applicable",
                report.passed(),
                report.failed(),
                report.not_applicable()
            );
            failure_lines.extend(report.failure_lines());
            passed += report.passed();
            failed += report.failed();
            not_applicable += report.not_applicable();
        }
        println!(
            "({not_applicable} scenarios not applicable to a store, by its declared capabilities)"
        );
        for line in &failure_lines {
            println!("  FAILED {line}");
        }
        println!("conformance: {passed} passed, {failed} failed");
        if failed == 0 {
            Ok(())
        } else {
            Err(format!("conformance: {failed} scenarios failed"))
        }
    }

    /// The holder role: builds the store the parent named and serves the protocol.
    async fn hold(self) -> Result<(), String> {
        let result = async {
            let label =
                std::env::var(HOLDER_STORE_VAR).map_err(|e| format!("{HOLDER_STORE_VAR}: {e}"))?;
            let factory = self
                .stores
                .iter()
                .find(|(l, _)| *l == label)
                .map(|(_, f)| f.clone())
                .ok_or_else(|| format!("no store `{label}` in this runner"))?;
            holder_process::serve(factory().await?).await
        };
        result
            .await
            .map_err(|error| format!("holder process: {error}"))
    }
}

/// Runs every applicable scenario (whose name contains one of `filter`, when given) against
/// `store`, one after another, printing a line per scenario.
///
/// ```
/// use std::sync::Arc;
/// use conformance_tests::{MemoryStore, run_suite};
///
/// # #[tokio::main]
/// # async fn main() {
/// let report = run_suite("memory", Arc::new(MemoryStore::new()), None, &["try_acquire_excludes".into()]).await;
/// assert_eq!((report.passed(), report.failed()), (1, 0));
/// # }
/// ```
pub async fn run_suite(
    label: &str,
    store: Arc<dyn TestStore>,
    holder_process: Option<HolderProcess>,
    filter: &[String],
) -> SuiteReport {
    let capabilities = match store.client().await {
        Ok(client) => client.capabilities(),
        Err(error) => {
            return SuiteReport {
                store: label.to_owned(),
                url: store.url(),
                capabilities: None,
                error: Some(format!("no client: {error}")),
                results: Vec::new(),
            };
        }
    };
    let mut results = Vec::new();
    for scenario in scenarios::all() {
        if !filter.is_empty() && !filter.iter().any(|f| scenario.name.contains(f.as_str())) {
            continue;
        }
        let ctx = Ctx {
            store: store.clone(),
            caps: capabilities.clone(),
            holder_process: holder_process.clone(),
            scenario: scenario.name,
        };
        let start = Instant::now();
        let (verdict, detail) = match (scenario.applies)(&ctx) {
            Applies::No(why) => (Verdict::NotApplicable, why.to_owned()),
            Applies::Yes => {
                let mut task = tokio::spawn((scenario.run)(ctx));
                match tokio::time::timeout(SCENARIO_LIMIT, &mut task).await {
                    Ok(Ok(Ok(()))) => (Verdict::Pass, String::new()),
                    Ok(Ok(Err(failure))) => (Verdict::Fail, failure.0),
                    Ok(Err(join)) => (Verdict::Fail, format!("panicked: {join}")),
                    Err(_) => {
                        // A hung scenario must not run on beside the next ones.
                        task.abort();
                        (Verdict::Fail, format!("hung for {SCENARIO_LIMIT:?}"))
                    }
                }
            }
        };
        let millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        match verdict {
            Verdict::Pass => println!("  pass  {} ({millis} ms)", scenario.name),
            Verdict::Fail => println!("  FAIL  {} ({millis} ms): {detail}", scenario.name),
            Verdict::NotApplicable => println!("  n/a   {}: {detail}", scenario.name),
        }
        results.push(ScenarioResult {
            scenario: scenario.name.to_owned(),
            covers: scenario.covers.to_owned(),
            verdict,
            detail,
            millis,
        });
    }
    SuiteReport {
        store: label.to_owned(),
        url: store.url(),
        capabilities: Some(capabilities),
        error: None,
        results,
    }
}
