//! Every scenario of the suite. Each group's file (named after the group's prefix) holds its
//! scenarios as `pub async fn`s, so a backend outside this workspace can run any one of
//! them, and registers them with the contract item each covers and when it applies
//! (`scenarios()`); [`all`] strings the groups together in run order.

/// One row of a group's registry: name, contract item covered, when it applies, the function.
macro_rules! scenario {
    ($name:literal, $covers:literal, $applies:expr, $run:path) => {
        Scenario {
            name: $name,
            covers: $covers,
            applies: $applies,
            run: |ctx| Box::pin($run(ctx)),
        }
    };
}

pub mod admin;
pub mod cancel;
pub mod drop;
pub mod errors;
pub mod exclusion;
pub mod expiry;
pub mod fencing;
pub mod leaks;
pub mod leases;
pub mod lost;
pub mod outage;
pub mod ownership;
pub mod process;
pub mod reentrancy;
pub mod waiting;
pub mod watchdog;

use crate::scenario::Scenario;

/// The whole suite, in run order. The outage group comes last: it restarts servers, and some
/// come back empty.
pub fn all() -> Vec<Scenario> {
    [
        exclusion::scenarios(),
        ownership::scenarios(),
        fencing::scenarios(),
        expiry::scenarios(),
        waiting::scenarios(),
        reentrancy::scenarios(),
        lost::scenarios(),
        watchdog::scenarios(),
        cancel::scenarios(),
        drop::scenarios(),
        process::scenarios(),
        errors::scenarios(),
        leaks::scenarios(),
        leases::scenarios(),
        admin::scenarios(),
        outage::scenarios(),
    ]
    .concat()
}
