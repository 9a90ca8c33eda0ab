//! `lockctl`: list, inspect, hold, force-release and benchmark the locks of any store
//! distributed-lock reaches, the store named by a URL (`--url`, or `LOCK_URL`).
//!
//! Tables by default, `--json` for scripts (one JSON document per command; `hold` prints one
//! line per event). Exit codes: 0 done, 1 failed, 2 bad usage, 3 a held lock was lost.

mod bench;
mod hold;
mod migrate;
mod output;

use std::{process::ExitCode, time::Duration};

use clap::{CommandFactory, Parser, Subcommand};
use distributed_lock::{HeldLock, LockError, LockName, StoreConfig};

use crate::output::Output;

const EXAMPLES: &str = "\
Examples:
  lockctl --url redis://127.0.0.1:6379 ls jobs/
  LOCK_URL='mysql://app:pw@db/app?strategy=row-lock' lockctl status jobs/nightly
  lockctl --url zk://zk1:2181,zk2:2181/locks hold jobs/nightly --ttl 30s
  lockctl --url redis://127.0.0.1:6379 release --force jobs/nightly
  lockctl --url redlock://a:6379,b:6379,c:6379 bench --clients 8 --seconds 5
  lockctl --url redis://127.0.0.1:6379 capabilities --json
  lockctl migrate status --record redis://127.0.0.1:6379
  lockctl completions bash > /etc/bash_completion.d/lockctl";

#[derive(Parser)]
#[command(
    name = "lockctl",
    version,
    about = "See, hold, take away and benchmark distributed locks of any store, named by a URL.",
    after_help = EXAMPLES
)]
struct Cli {
    /// The store: redis://, redis+cluster://, redlock://, mysql://, mariadb://, zk://,
    /// memory:// (see distributed-lock's README).
    #[arg(long, env = "LOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,
    /// JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The held locks whose names start with PREFIX (all of them without one).
    Ls {
        /// The start of the names.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Who holds NAME, with its fence and time left. What it shows may have changed by the
    /// time it is read: observability, never a check before acting.
    Status {
        /// The lock's name.
        name: String,
    },
    /// Takes NAME and holds it (renewing) until Ctrl-C, then releases it. Prints the fence.
    Hold {
        /// The lock's name.
        name: String,
        /// The lease TTL (renewed every third of it).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// How long to wait for the current holder.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
    /// Takes NAME away from its holder (an operator action). The holder learns at its next
    /// renewal; prints the fence floor to give resources so they reject its late writes.
    Release {
        /// Required: this ends someone else's hold.
        #[arg(long, required = true)]
        force: bool,
        /// The lock's name.
        name: String,
    },
    /// A quick benchmark against the store: CLIENTS separate clients take and release one
    /// lock for SECONDS.
    Bench {
        /// Separate clients (each with its own connections).
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// How long.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// What the store declares (fencing, expiry, wake-up, order, clock, failover, ...).
    Capabilities,
    /// A migration between two stores, step by step (status, init, verify, flip, finish).
    Migrate {
        #[command(subcommand)]
        step: migrate::Step,
    },
    /// Prints a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Fails with a message on standard error.
#[derive(Debug)]
struct Failed(String);

impl From<LockError> for Failed {
    fn from(error: LockError) -> Self {
        Self(error.to_string())
    }
}

fn name(text: &str) -> Result<LockName, Failed> {
    Ok(LockName::new(text)?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "lockctl",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(Failed(why)) => {
            eprintln!("lockctl: {why}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Failed> {
    let out = Output::new(cli.json);
    if let Command::Migrate { step } = cli.command {
        migrate::run(step, &out).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(url) = cli.url else {
        return Err(Failed(
            "no store: give --url or set LOCK_URL (for example redis://127.0.0.1:6379)".into(),
        ));
    };
    let config: StoreConfig = url.parse()?;
    match cli.command {
        Command::Ls { prefix } => {
            let store = config.backend().await?;
            out.held(&store.list(&prefix).await?);
        }
        Command::Status { name: text } => {
            let name = name(&text)?;
            let store = config.backend().await?;
            let held = store.inspect(&name).await?.map(|info| {
                HeldLock::new(info.name, &info.token, info.fence, info.expires_in, None)
            });
            out.status(&name, held.as_ref());
        }
        Command::Hold {
            name: text,
            ttl,
            wait,
        } => {
            return hold::run(&config, &name(&text)?, ttl, wait, &out).await;
        }
        Command::Release { force, name: text } => {
            // clap makes `--force` required; checked again so the intent stays explicit.
            if !force {
                return Ok(ExitCode::from(2));
            }
            let name = name(&text)?;
            let store = config.backend().await?;
            out.forced(&name, store.force_release(&name).await?.as_ref());
        }
        Command::Bench { clients, seconds } => {
            out.bench(&bench::run(&config, clients, Duration::from_secs(seconds)).await?);
        }
        Command::Capabilities => {
            let store = config.backend().await?;
            out.capabilities(&config, &store.capabilities());
        }
        Command::Completions { .. } | Command::Migrate { .. } => {}
    }
    Ok(ExitCode::SUCCESS)
}
