//! Workspace automation for the distributed-lock project.
//!
//! Run it through the cargo alias: `cargo xtask <command>`.
//!
//! * `cargo xtask services up|down|status|env` manages the local Redis, MariaDB and
//!   ZooKeeper servers the tests run against (state under `<workspace>/target/services`).
//! * `cargo xtask test` starts the services, then runs fmt, clippy, the docs, the package
//!   check, the test suite and a short seeded fault campaign (20 s per store).
//! * `cargo xtask compare` runs the comparison and writes its report
//!   (`target/compare/report.html`, `.md`, `.json`).
//! * `cargo xtask report [FILE]` writes the report again from a compare run's `report.json`.
//! * `cargo xtask chaos [STORE...] [--duration S] [--seed N]` runs the fault campaign.

mod built;
mod cargo;
mod chaos;
mod compare;
mod migration_matrix;
mod msrv;
mod report;
mod services;
mod steps;
mod test_cmd;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Command line of `cargo xtask`.
#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    about = "Workspace automation for the distributed-lock project"
)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Manage the local test servers (Redis, MariaDB, ZooKeeper).
    Services {
        /// What to do with the servers.
        #[command(subcommand)]
        action: ServicesAction,
    },
    /// Start the services, then run `cargo fmt --check`, `cargo clippy`, `cargo doc`,
    /// `cargo package`, `cargo test` and a short fault campaign (`chaos run --duration 20`).
    Test(test_cmd::TestArgs),
    /// Run the comparison; writes `target/compare/report.html`, `report.md` and
    /// `report.json`.
    Compare(compare::CompareArgs),
    /// Write the report again (HTML, Markdown, terminal summary) from the `report.json` of a
    /// compare run, without running anything.
    Report {
        /// The compare run's `report.json` (default: `target/compare/report.json`); the
        /// report is written beside it.
        file: Option<PathBuf>,
    },
    /// Run the fault campaign: worker processes contend for locks under faults, and the
    /// history is judged (arguments go to `chaos run`: stores, `--duration`, `--seed`, ...).
    Chaos {
        /// Stores and options for `chaos run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Subcommands of `cargo xtask services`.
#[derive(Debug, Subcommand)]
enum ServicesAction {
    /// Install missing packages, start every server that is not running, wait until all
    /// answer, then print the environment (as `env` does).
    Up,
    /// Stop every server started by `up` (data directories are kept).
    Down,
    /// Show a table of the servers and whether they are up.
    Status,
    /// Print `export NAME=value` lines for the test environment variables.
    Env,
}

/// The workspace root (the parent of this crate's directory).
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.to_path_buf(), Path::to_path_buf)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Services { action } => match action {
            ServicesAction::Up => services::up(true),
            ServicesAction::Down => services::down(),
            ServicesAction::Status => services::status(),
            ServicesAction::Env => {
                services::print_env();
                Ok(())
            }
        },
        Command::Test(args) => test_cmd::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Report { file } => report::rewrite(
            &file.unwrap_or_else(|| workspace_root().join("target/compare/report.json")),
        ),
        Command::Chaos { args } => chaos::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
