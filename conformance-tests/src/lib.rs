//! The conformance suite: the scenarios every lock backend must pass against a real store,
//! as a library.
//!
//! A backend's test registers its stores with a [`Runner`] (one call); the runner picks the
//! scenarios that apply from the backend's declared [`Capabilities`](lock_core::Capabilities),
//! runs them one after another with random lock names, prints a line per scenario and the
//! closing `N passed, N failed` line, and writes a JSON [`SuiteReport`] for
//! `cargo xtask compare` when [`REPORT_DIR_VAR`] is set. A store that cannot be reached
//! fails; nothing is skipped silently. Scenarios that do not apply are listed as such, with
//! the reason.
//!
//! The suite proves it can fail: `tests/suite_catches_broken_backends` runs it against
//! deliberately broken wrappers of [`lock_core::MemoryBackend`] and checks each is caught.

pub mod bench;
pub mod bounds;
mod cases;
mod delaying;
pub mod faults;
pub mod holder_process;
mod memory_store;
pub mod migration;
mod report;
mod runner;
mod scenario;
pub mod scenarios;
pub mod selection;
mod services;
mod store;

pub use cases::{CaseFuture, Cases};
pub use delaying::DelayingBackend;
pub use holder_process::{
    HOLDER_NAME_VAR, HOLDER_STORE_VAR, HOLDER_TTL_VAR, HeldByChild, HolderProcess,
};
pub use memory_store::{MemoryStore, Unreachable};
pub use report::{ScenarioResult, SuiteReport, Verdict};
pub use runner::{REPORT_DIR_VAR, Runner, run_suite};
pub use scenario::{Applies, CountingBackend, Ctx, Failure, Outcome, Scenario, ScenarioFuture};
pub use scenarios::all as all_scenarios;
pub use services::{SERVICES_DIR_VAR, Services};
pub use store::TestStore;

/// The multi-threaded Tokio runtime (2 workers) the test binaries run on.
///
/// # Errors
/// When the runtime cannot be built, as text.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a Tokio runtime: {e}"))
}

/// The `main` of a test or benchmark binary: runs `main` on [`runtime`] and exits with
/// failure, printing why on stderr, when the runtime cannot start or `main` fails.
pub fn main_with<F>(main: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<(), String>>,
{
    match runtime().and_then(|runtime| runtime.block_on(main)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            std::process::ExitCode::FAILURE
        }
    }
}
