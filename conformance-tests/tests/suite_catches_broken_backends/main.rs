//! The suite proves it can fail: it runs, whole, against each deliberately broken wrapper of
//! `MemoryBackend`, and every wrapper must be caught by the scenarios that check the rule it
//! breaks.

mod broken;

use std::{process::ExitCode, sync::Arc};

use broken::{BrokenStore, Fault};
use conformance_tests::run_suite;

fn main() -> ExitCode {
    let runtime = match conformance_tests::runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut caught, mut missed) = (0, 0);
    for fault in Fault::ALL {
        let label = format!("broken-{fault:?}");
        println!("suite against {label}");
        let report = runtime.block_on(run_suite(
            &label,
            Arc::new(BrokenStore::new(fault)),
            None,
            &[],
        ));
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
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
