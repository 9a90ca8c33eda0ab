//! The conformance suite on MySQL/MariaDB, both strategies, against the server named by
//! `LOCK_TEST_MYSQL_URL` (`cargo xtask test` starts one and sets it). Without the variable, or
//! with a server that does not answer, both stores fail: nothing is skipped.

mod support;

use std::process::ExitCode;

use lock_mysql::Strategy;
use support::MySqlStore;

fn main() -> ExitCode {
    let code = conformance_tests::Runner::new()
        .store("mysql-lease", || MySqlStore::new(Strategy::Lease))
        .store("mysql-rowlock", || MySqlStore::new(Strategy::RowLock))
        .main();
    if std::env::var_os(conformance_tests::HOLDER_STORE_VAR).is_some() || support::url().is_err() {
        return code;
    }
    // This run's tables go; a failure to drop them is reported but does not hide the verdict.
    let dropped = conformance_tests::runtime()
        .and_then(|runtime| runtime.block_on(support::drop_run_tables()));
    match dropped {
        Ok(()) => code,
        Err(error) => {
            println!("cleaning up: {error}");
            ExitCode::FAILURE
        }
    }
}
