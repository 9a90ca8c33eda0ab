//! The suite proves it can fail: it runs, whole, against each deliberately broken wrapper of
//! `MemoryBackend`, and every wrapper must be caught by the scenarios that check the rule it
//! breaks.
//!
//! Each broken backend's suite runs in a child process of this binary ([`ONE_ARG`]), up to
//! [`AT_ONCE`] of them at a time: a suite mostly waits for its leases' and budgets' timers, so
//! several overlap well (one after another they took 189 s of `cargo xtask test`; four at a
//! time 59 s here, as long as the suite against `LosesWakeups` alone). Each child's output is
//! printed whole when it ends, in the order of [`Fault::ALL`].

mod broken;

use std::{
    process::{Command, ExitCode, Output},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use broken::{BrokenStore, Fault};
use conformance_tests::run_suite;

/// The argument that makes this binary run the suite against the one broken backend named
/// after it (its `Debug` name) and exit with success when that backend was caught.
const ONE_ARG: &str = "--one-broken-backend";

/// How many suites run at once.
const AT_ONCE: usize = 4;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
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
    let next = AtomicUsize::new(0);
    let outputs: Vec<Mutex<Option<std::io::Result<Output>>>> =
        Fault::ALL.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..AT_ONCE {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(fault) = Fault::ALL.get(i) else {
                        return;
                    };
                    let output = Command::new(&exe)
                        .args([ONE_ARG, &format!("{fault:?}")])
                        .output();
                    if let Some(slot) = outputs.get(i) {
                        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(output);
                    }
                }
            });
        }
    });
    let (mut caught, mut missed) = (0, 0);
    for (fault, output) in Fault::ALL.iter().zip(outputs) {
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
                println!("MISSED {fault:?}: its suite could not run: {error}");
            }
            None => {
                missed += 1;
                println!("MISSED {fault:?}: its suite did not run");
            }
        }
    }
    println!("broken backends: {caught} passed, {missed} failed");
    if missed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("{missed} broken backends were not caught");
        ExitCode::FAILURE
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
