//! The suite proves it can fail: it runs, whole, against each deliberately broken wrapper of
//! `MemoryBackend`, and every wrapper must be caught by the scenarios that check the rule it
//! breaks.

mod broken;

use std::{process::ExitCode, sync::Arc};

use broken::{BrokenStore, Fault};
use conformance_tests::run_suite;

fn main() -> ExitCode {
    conformance_tests::main_with(catch_every_broken_backend())
}

/// Runs the suite against every broken backend; fails when one of them is not caught by the
/// scenarios that must catch it.
async fn catch_every_broken_backend() -> Result<(), String> {
    let (mut caught, mut missed) = (0, 0);
    for fault in Fault::ALL {
        let label = format!("broken-{fault:?}");
        println!("suite against {label}");
        let report = run_suite(&label, Arc::new(BrokenStore::new(fault)), None, &[]).await;
        let failures = report.failures();
        let missing: Vec<_> = fault
            .caught_by()
            .iter()
            .filter(|s| !failures.contains(s))
            .collect();
        if missing.is_empty() {
            caught += 1;
            println!("caught {fault:?}: failed {failures:?}");
        } else {
            missed += 1;
            println!(
                "MISSED {fault:?}: these scenarios passed but must fail: {missing:?} (failed: {failures:?})"
            );
        }
    }
    println!("broken backends: {caught} passed, {missed} failed");
    if missed == 0 {
        Ok(())
    } else {
        Err(format!("{missed} broken backends were not caught"))
    }
}
