//! `chaos`: the fault campaign (`cargo xtask chaos` runs it). `chaos run [STORE...]` runs a
//! campaign per store and judges it; `chaos worker ...` is one worker process (the campaign
//! starts them).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use comfy_table::Table;
use lock_chaos::{
    campaign::{self, Plan, Summary},
    stores,
    worker::{self, Job},
};

#[derive(Parser)]
#[command(about = "The fault campaign: many processes contend for locks under faults.")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs a campaign on each store (every store when none is named).
    Run(RunArgs),
    /// One worker process (started by `run`).
    Worker(WorkerArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The stores.
    stores: Vec<String>,
    /// Seconds of contention per store.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// The seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker processes at a time.
    #[arg(long, default_value_t = 6)]
    workers: usize,
    /// Lock names (1: everyone on one lock).
    #[arg(long, default_value_t = 1)]
    names: usize,
    /// The lease TTL, in ms.
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// The wait budget of each acquire, in ms.
    #[arg(long, default_value_t = 2000)]
    wait_ms: u64,
    /// Inject no faults.
    #[arg(long)]
    no_faults: bool,
    /// The negative control: the resource accepts every fence.
    #[arg(long)]
    no_fence_check: bool,
    /// Per mille of writes where a worker freezes between deciding to write and writing.
    #[arg(long, default_value_t = 20)]
    pause_writes: u32,
    /// Where the JSON summaries (`<store>.json`) and histories (`<store>.history.json`) go.
    #[arg(long, default_value = "target/chaos")]
    out: PathBuf,
}

#[derive(clap::Args)]
struct WorkerArgs {
    #[arg(long)]
    store: String,
    #[arg(long)]
    id: u32,
    /// Comma-separated lock names.
    #[arg(long)]
    names: String,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    wait_ms: u64,
    #[arg(long)]
    until_ns: u64,
    #[arg(long)]
    resource: String,
    #[arg(long)]
    seed: u64,
    #[arg(long, default_value_t = 0)]
    pause_writes: u32,
    /// The campaign's pid: the worker ends when that process does.
    #[arg(long)]
    campaign: u32,
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match Cli::parse().command {
            Cmd::Worker(args) => worker(args).await.map(|()| true),
            Cmd::Run(args) => campaigns(args).await,
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn worker(args: WorkerArgs) -> Result<(), String> {
    // A panic anywhere (a task of the lock library included) ends the worker with 101, which
    // the campaign counts.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("chaos worker: {info}");
        std::process::exit(101);
    }));
    // A campaign that dies (killed, say) takes its workers with it, frozen ones too: the
    // kernel kills this process when the thread that started it ends. A campaign gone
    // before that was set up is seen in the parent's pid.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| format!("setting the parent-death signal: {e}"))?;
    if std::os::unix::process::parent_id() != args.campaign {
        return Err("the campaign that started this worker is gone".into());
    }
    let job = Job {
        store: args.store,
        id: args.id,
        names: args.names.split(',').map(str::to_owned).collect(),
        ttl: Duration::from_millis(args.ttl_ms),
        wait: Duration::from_millis(args.wait_ms),
        until: args.until_ns,
        resource: args.resource,
        seed: args.seed,
        pause_writes: args.pause_writes,
    };
    worker::run(&job).await
}

/// Runs a campaign per store, prints the table, saves the summaries; whether all passed.
async fn campaigns(args: RunArgs) -> Result<bool, String> {
    let chosen = if args.stores.is_empty() {
        stores::STORES.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.stores
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut summaries = Vec::new();
    for store in chosen {
        let plan = Plan {
            store,
            workers: args.workers,
            duration: Duration::from_secs(args.duration),
            seed: args.seed,
            names: args.names,
            ttl: Duration::from_millis(args.ttl_ms),
            wait: Duration::from_millis(args.wait_ms),
            faults: !args.no_faults,
            check_fences: !args.no_fence_check,
            pause_writes: args.pause_writes,
        };
        eprintln!(
            "chaos: {} for {} s, seed {}",
            plan.store, args.duration, args.seed
        );
        let (history, summary) = campaign::run(&plan, exe.clone()).await?;
        save(&args.out, &summary)?;
        save_history(&args.out, &summary.store, &history)?;
        summaries.push(summary);
    }
    println!("{}", table(&summaries));
    let failed: Vec<_> = summaries
        .iter()
        .filter(|s| !s.violations.is_empty())
        .map(|s| format!("{}: {}", s.store, s.violations.join("; ")))
        .collect();
    for line in &failed {
        eprintln!("chaos: FAILED {line}");
    }
    Ok(failed.is_empty())
}

fn save(dir: &std::path::Path, summary: &Summary) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{}.json", summary.store));
    let text = serde_json::to_string_pretty(summary).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The whole history beside the summary (`<store>.history.json`), for reading a finding
/// against the faults that were in progress.
fn save_history(
    dir: &std::path::Path,
    store: &str,
    history: &lock_chaos::History,
) -> Result<(), String> {
    let path = dir.join(format!("{store}.history.json"));
    let text = serde_json::to_string(history).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn table(summaries: &[Summary]) -> Table {
    let mut table = Table::new();
    table.set_header([
        "store",
        "strict",
        "acquisitions",
        "overlaps",
        "trusted",
        "stale writes",
        "fence regressions",
        "stuck gaps",
        "panics",
        "faults",
        "errors",
        "verdict",
    ]);
    for s in summaries {
        let f = &s.findings;
        let errors: u64 = f
            .errors
            .iter()
            .filter(|(k, _)| *k != "Timeout")
            .map(|(_, n)| n)
            .sum();
        table.add_row([
            s.store.clone(),
            s.strict.to_string(),
            f.acquisitions.to_string(),
            f.overlaps.to_string(),
            f.trusted_overlaps.to_string(),
            f.stale_writes.to_string(),
            f.fence_regressions.to_string(),
            f.stuck_gaps.to_string(),
            f.panics.to_string(),
            f.faults.to_string(),
            errors.to_string(),
            if s.violations.is_empty() {
                "pass".into()
            } else {
                "FAIL".into()
            },
        ]);
    }
    table
}
