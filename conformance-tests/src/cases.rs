//! [`Cases`]: the `main` of a backend's fault-test binary (`harness = false`): cases that stop
//! and start servers, so they run one after another, each under a time limit.

use std::{
    fmt::Display,
    future::Future,
    pin::Pin,
    process::ExitCode,
    time::{Duration, Instant},
};

/// A boxed case future.
pub type CaseFuture<E> = Pin<Box<dyn Future<Output = Result<(), E>>>>;

/// A named case.
type Case<E> = (&'static str, fn() -> CaseFuture<E>);

/// Sequential cases with a closing `N passed, N failed` line.
///
/// ```
/// use conformance_tests::Cases;
///
/// let code = Cases::<String>::new("example")
///     .case("always_passes", || Box::pin(async { Ok(()) }))
///     .main();
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct Cases<E> {
    label: String,
    cases: Vec<Case<E>>,
    limit: Duration,
    on_failure: Option<Box<dyn Fn()>>,
    finally: Option<fn() -> CaseFuture<E>>,
}

impl<E> std::fmt::Debug for Cases<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.cases.iter().map(|(n, _)| n).collect();
        f.debug_struct("Cases")
            .field("label", &self.label)
            .field("cases", &names)
            .finish()
    }
}

impl<E: Display> Cases<E> {
    /// No cases yet; `label` starts the closing line.
    pub fn new(label: &str) -> Self {
        Self {
            label: label.to_owned(),
            cases: Vec::new(),
            limit: Duration::from_secs(180),
            on_failure: None,
            finally: None,
        }
    }

    /// Adds a case.
    pub fn case(mut self, name: &'static str, run: fn() -> CaseFuture<E>) -> Self {
        self.cases.push((name, run));
        self
    }

    /// Sets how long one case may run before it counts as hung (default 180 s).
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Runs after each failed case (for example to print recent diagnostic events).
    pub fn on_failure(mut self, report: impl Fn() + 'static) -> Self {
        self.on_failure = Some(Box::new(report));
        self
    }

    /// Runs after all cases (clean-up); its failure counts as a failed case.
    pub fn finally(mut self, run: fn() -> CaseFuture<E>) -> Self {
        self.finally = Some(run);
        self
    }

    /// Runs the cases whose name contains a command-line argument (all when none is given)
    /// and returns the exit code: failure when any case failed.
    pub fn main(self) -> ExitCode {
        crate::main_with(self.run())
    }

    async fn run(self) -> Result<(), String> {
        let filter: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        let (mut passed, mut failed) = (0, 0);
        let finally = self.finally.map(|run| ("clean-up", run));
        let selected = self.cases.iter().copied().filter(|(name, _)| {
            filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()))
        });
        for (name, run) in selected.chain(finally) {
            let start = Instant::now();
            let outcome = match tokio::time::timeout(self.limit, run()).await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err(format!("hung for {:?}", self.limit)),
            };
            let millis = start.elapsed().as_millis();
            match outcome {
                Ok(()) => {
                    passed += 1;
                    println!("  pass  {name} ({millis} ms)");
                }
                Err(why) => {
                    failed += 1;
                    println!("  FAIL  {name} ({millis} ms): {why}");
                    if let Some(report) = &self.on_failure {
                        report();
                    }
                }
            }
        }
        println!("{}: {passed} passed, {failed} failed", self.label);
        if failed == 0 {
            Ok(())
        } else {
            Err(format!("{}: {failed} cases failed", self.label))
        }
    }
}
