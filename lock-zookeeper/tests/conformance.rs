//! The conformance suite on a standalone ZooKeeper server and on a 3-node ensemble.
//!
//! The servers come from `cargo xtask services` (`LOCK_TEST_ZK_ADDR`, `LOCK_TEST_ZK_ENSEMBLE`);
//! an unset variable or a server that does not answer fails the store, never skips it.

mod support;

use std::time::Duration;

use support::{ENSEMBLE_VAR, STANDALONE_VAR, ZkStore};

/// The session timeout of every test client: the TTL the scenarios work with.
const SESSION_TIMEOUT: Duration = Duration::from_secs(2);

fn main() -> std::process::ExitCode {
    conformance_tests::Runner::new()
        .store("zookeeper", || {
            ZkStore::from_env(STANDALONE_VAR, SESSION_TIMEOUT)
        })
        .store("zookeeper-ensemble(3)", || {
            ZkStore::from_env(ENSEMBLE_VAR, SESSION_TIMEOUT)
        })
        .main()
}
