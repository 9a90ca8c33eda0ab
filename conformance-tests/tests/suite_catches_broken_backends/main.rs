//! The suite proves it can fail: it runs, whole, against each deliberately broken wrapper of
//! `MemoryBackend`, and every wrapper must be caught by the scenarios that check the rule it
//! breaks.
//!
//! Each broken backend's suite runs in a child process of this binary ([`ONE_ARG`]), up to
//! [`AT_ONCE`] of them at a time: a suite mostly waits for its leases' and budgets' timers, so
//! several overlap well (one after another they took 189 s of `cargo xtask test`; four at a
//! time 59 s here, as long as the suite against `LosesWakeups` alone). Each child's output is
//! printed whole when they have all ended, in the order of [`Fault::ALL`]; a child cannot hang
//! for ever, as the suite stops each scenario at its time limit.
//!
//! A failing scenario counts as catching a broken backend, and load could make a scenario
//! fail on its own: so a control child runs the suite against the unbroken `MemoryBackend`
//! among them, under the same load, and every one of its scenarios must pass.

mod broken;

use std::{
    process::{Command, ExitCode, Output},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use broken::{BrokenStore, Fault};
use conformance_tests::{MemoryStore, run_suite};

/// The argument that makes this binary run the suite against the one broken backend named
/// after it (its `Debug` name) and exit with success when that backend was caught.
const ONE_ARG: &str = "--one-broken-backend";

/// The name [`ONE_ARG`] takes for the control: the unbroken `MemoryBackend`.
const CONTROL: &str = "Unbroken";

/// How many suites run at once.
const AT_ONCE: usize = 4;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, name] if flag == ONE_ARG && name == CONTROL => {
            conformance_tests::main_with(pass_unbroken())
        }
        [flag, name] if flag == ONE_ARG => conformance_tests::main_with(catch_one(name)),
        _ => catch_every_broken_backend(),
    }
}

/// Runs every broken backend's suite in a child process; fails when one of them is not
/// caught (or its child could not run).
fn catch_every_broken_backend() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            eprintln!("finding this test's executable: {error}");
            return ExitCode::FAILURE;
        }
    };
    // The control among the first, so it runs beside the others.
    let names: Vec<String> = std::iter::once(CONTROL.to_owned())
        .chain(Fault::ALL.iter().map(|fault| format!("{fault:?}")))
        .collect();
    let next = AtomicUsize::new(0);
    let outputs: Vec<Mutex<Option<std::io::Result<Output>>>> =
        names.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..AT_ONCE {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(name) = names.get(i) else {
                        return;
                    };
                    let output = Command::new(&exe).args([ONE_ARG, name]).output();
                    if let Some(slot) = outputs.get(i) {
                        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(output);
                    }
                }
            });
        }
    });
    let (mut caught, mut missed) = (0, 0);
    for (name, output) in names.iter().zip(outputs) {
        match output.into_inner().unwrap_or_else(PoisonError::into_inner) {
            Some(Ok(output)) => {
                print!("{}", String::from_utf8_lossy(&output.stdout));
                eprint!("{}", String::from_utf8_lossy(&output.stderr));
                if output.status.success() {
                    caught += 1;
                } else {
                    missed += 1;
                }
            }
            Some(Err(error)) => {
                missed += 1;
                println!("MISSED {name}: its suite could not run: {error}");
            }
            None => {
                missed += 1;
                println!("MISSED {name}: its suite did not run");
            }
        }
    }
    println!("broken backends and the control: {caught} passed, {missed} failed");
    if missed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("{missed} broken backends were not caught, or the control failed");
        ExitCode::FAILURE
    }
}

/// Runs the suite against the unbroken `MemoryBackend`: every scenario must pass, or the
/// load of the suites running beside it could be what made the broken backends' scenarios fail.
async fn pass_unbroken() -> Result<(), String> {
    println!("suite against the unbroken memory backend (the control)");
    let report = run_suite("memory", Arc::new(MemoryStore::new()), None, &[]).await;
    let failures = report.failures();
    if failures.is_empty() {
        println!("control passed");
        Ok(())
    } else {
        println!("MISSED the control: the unbroken backend failed {failures:?}");
        Err("the control failed".to_owned())
    }
}

/// Runs the suite against the broken backend `name`; fails when the scenarios that must catch
/// it did not all fail.
async fn catch_one(name: &str) -> Result<(), String> {
    let fault = Fault::ALL
        .into_iter()
        .find(|fault| format!("{fault:?}") == name)
        .ok_or_else(|| format!("no broken backend is called {name}"))?;
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
        println!("caught {fault:?}: failed {failures:?}");
        Ok(())
    } else {
        println!(
            "MISSED {fault:?}: these scenarios passed but must fail: {missing:?} (failed: {failures:?})"
        );
        Err(format!("{fault:?} was not caught"))
    }
}
