//! `cargo xtask services up|down|status|env`: the local servers the tests run against.
//!
//! Every instance lives in its own directory under `<workspace>/target/services/`, which
//! holds its pid file (`pid`), its log, its data, and two generated scripts, `start` and
//! `stop`, so that fault-injection tests can stop and restart one server.

mod install;
mod mariadb;
mod process;
mod redis;
mod redis_tls;
mod zookeeper;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use self::process::PidState;

/// Port of the single Redis.
const REDIS_PORT: u16 = 16379;
/// TLS port of the single Redis (16390 and 16391 are the fault tests' replicas).
const REDIS_TLS_PORT: u16 = 16388;
/// Ports of the five independent Redlock Redis servers.
const REDLOCK_PORTS: [u16; 5] = [16380, 16381, 16382, 16383, 16384];
/// Ports of the three Redis Cluster masters.
const REDIS_CLUSTER_PORTS: [u16; 3] = [17001, 17002, 17003];
/// Port of MariaDB.
const MARIADB_PORT: u16 = 13306;
/// Client port of the standalone ZooKeeper.
const ZK_PORT: u16 = 12181;
/// Client ports of the three-node ZooKeeper ensemble.
const ZK_ENSEMBLE_PORTS: [u16; 3] = [12182, 12183, 12184];

/// MariaDB database, user and password the tests use.
const MYSQL_DATABASE: &str = "locktest";
/// MariaDB user for the tests.
const MYSQL_USER: &str = "lock";
/// Password of [`MYSQL_USER`].
const MYSQL_PASSWORD: &str = "lockpw";

/// Which server an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A Redis server; `cluster` for a Redis Cluster node.
    Redis {
        /// Started with `--cluster-enabled yes`.
        cluster: bool,
    },
    /// The MariaDB server.
    MariaDb,
    /// A ZooKeeper server; `myid` is set for ensemble members.
    ZooKeeper {
        /// The server id within the ensemble, `None` when standalone.
        myid: Option<u8>,
    },
}

/// One server process we manage.
#[derive(Debug, Clone)]
struct Instance {
    /// Name shown by `status` (also the directory, relative to the services root).
    name: String,
    /// Client port.
    port: u16,
    /// Directory holding the pid file, logs, data and scripts.
    dir: PathBuf,
    /// Which server.
    kind: Kind,
    /// A second port that speaks TLS (the single Redis).
    tls_port: Option<u16>,
}

impl Instance {
    /// Creates an instance whose directory is `root/name`.
    fn new(root: &Path, name: &str, port: u16, kind: Kind) -> Self {
        Self {
            name: name.to_string(),
            port,
            dir: root.join(name),
            kind,
            tls_port: None,
        }
    }

    /// The same instance, also listening for TLS on `port`.
    fn with_tls_port(mut self, port: u16) -> Self {
        self.tls_port = Some(port);
        self
    }

    /// The canonical pid file, `<dir>/pid`.
    fn pid_file(&self) -> PathBuf {
        self.dir.join(process::PID_FILE)
    }

    /// The server's log file.
    fn log_file(&self) -> PathBuf {
        match self.kind {
            Kind::Redis { .. } => redis::log_file(self),
            Kind::MariaDb => mariadb::log_file(self),
            Kind::ZooKeeper { .. } => zookeeper::log_file(self),
        }
    }

    /// Strings the live process's command line must contain (guards against pid reuse).
    fn expected_cmdline(&self) -> Vec<String> {
        match self.kind {
            Kind::Redis { .. } => redis::expected_cmdline(self),
            Kind::MariaDb => mariadb::expected_cmdline(self),
            Kind::ZooKeeper { .. } => zookeeper::expected_cmdline(self),
        }
    }

    /// What the pid file says.
    fn pid_state(&self) -> PidState {
        process::pid_state(&self.pid_file(), &self.expected_cmdline())
    }

    /// True if the server answers its health check.
    fn answers(&self) -> bool {
        match self.kind {
            Kind::Redis { .. } => redis::answers(self.port),
            Kind::MariaDb => mariadb::answers(self.port),
            Kind::ZooKeeper { .. } => zookeeper::mode(self.port).is_some(),
        }
    }
}

/// Every instance, in display order.
fn instances(root: &Path) -> Vec<Instance> {
    let mut all = vec![
        Instance::new(root, "redis", REDIS_PORT, Kind::Redis { cluster: false })
            .with_tls_port(REDIS_TLS_PORT),
    ];
    for (i, port) in REDLOCK_PORTS.iter().enumerate() {
        all.push(Instance::new(
            root,
            &format!("redlock-{i}"),
            *port,
            Kind::Redis { cluster: false },
        ));
    }
    for port in REDIS_CLUSTER_PORTS {
        all.push(Instance::new(
            root,
            &format!("redis-cluster/{port}"),
            port,
            Kind::Redis { cluster: true },
        ));
    }
    all.push(Instance::new(root, "mariadb", MARIADB_PORT, Kind::MariaDb));
    all.push(Instance::new(
        root,
        "zookeeper",
        ZK_PORT,
        Kind::ZooKeeper { myid: None },
    ));
    for (i, port) in (1u8..).zip(ZK_ENSEMBLE_PORTS) {
        all.push(Instance::new(
            root,
            &format!("zk-ensemble-{i}"),
            port,
            Kind::ZooKeeper { myid: Some(i) },
        ));
    }
    all
}

/// `<workspace>/target/services` (deliberately not `CARGO_TARGET_DIR`).
pub(crate) fn services_root() -> PathBuf {
    crate::workspace_root().join("target").join("services")
}

/// The environment variables the tests read, as `(name, value)` pairs.
pub(crate) fn env_vars() -> Vec<(String, String)> {
    let redis_urls = |ports: &[u16]| {
        ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let zk_addrs = ZK_ENSEMBLE_PORTS
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    [
        ("LOCK_TEST_REDIS_URL", redis_urls(&[REDIS_PORT])),
        (
            "LOCK_TEST_REDIS_TLS_URL",
            format!(
                "rediss://127.0.0.1:{REDIS_TLS_PORT}?ca_file={}",
                services_root()
                    .join("redis")
                    .join(redis_tls::CA_FILE)
                    .display()
            ),
        ),
        ("LOCK_TEST_REDLOCK_URLS", redis_urls(&REDLOCK_PORTS)),
        (
            "LOCK_TEST_REDIS_CLUSTER_URLS",
            redis_urls(&REDIS_CLUSTER_PORTS),
        ),
        (
            "LOCK_TEST_MYSQL_URL",
            format!(
                "mysql://{MYSQL_USER}:{MYSQL_PASSWORD}@127.0.0.1:{MARIADB_PORT}/{MYSQL_DATABASE}"
            ),
        ),
        ("LOCK_TEST_ZK_ADDR", format!("127.0.0.1:{ZK_PORT}")),
        ("LOCK_TEST_ZK_ENSEMBLE", zk_addrs),
        (
            "LOCK_TEST_SERVICES_DIR",
            services_root().display().to_string(),
        ),
        (
            "LOCK_TEST_FAKETIME",
            install::find_program("faketime")
                .unwrap_or_else(|| PathBuf::from("/usr/bin/faketime"))
                .display()
                .to_string(),
        ),
        (
            "LOCK_TEST_CHROMIUM",
            install::find_program("chromium")
                .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
                .display()
                .to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Prints the `export NAME=value` lines of [`env_vars`] on stdout.
pub(crate) fn print_env() {
    for (name, value) in env_vars() {
        println!("export {name}={}", process::shell_quote(&value));
    }
}

/// What [`ensure_started`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Running and answering already: nothing to do.
    AlreadyUp,
    /// Running but not answering yet (starting, or was stopped with SIGSTOP): wait.
    Running,
    /// Freshly started: wait.
    Started,
}

/// Starts `inst` with `start` unless its pid file names a live process. A stale pid file is
/// removed first. Refuses to start if the port is held by a process we did not start.
fn ensure_started(inst: &Instance, start: impl FnOnce() -> Result<()>) -> Result<Start> {
    match inst.pid_state() {
        PidState::Alive(pid) => {
            if inst.answers() {
                return Ok(Start::AlreadyUp);
            }
            // Perhaps a test left it stopped; waking a running process is harmless.
            process::signal(pid, "CONT")?;
            return Ok(Start::Running);
        }
        PidState::Stale(pid) | PidState::Foreign(pid) => {
            eprintln!(
                "xtask: {}: stale pid file (pid {pid} is gone or not ours), restarting",
                inst.name
            );
            process::remove_file(&inst.pid_file())?;
        }
        PidState::Missing => {}
    }
    if process::port_open(inst.port) {
        bail!(
            "{}: port {} is in use by a process xtask did not start (no live pid file in {}); \
             stop that process first",
            inst.name,
            inst.port,
            inst.dir.display()
        );
    }
    start().with_context(|| format!("starting {}", inst.name))?;
    Ok(Start::Started)
}

/// Waits until `inst` answers its health check; fails early if its process dies or never
/// writes its pid file.
fn wait_ready(inst: &Instance) -> Result<()> {
    let begun = Instant::now();
    process::wait_until(
        &inst.name,
        &inst.log_file(),
        process::READY_TIMEOUT,
        || match inst.pid_state() {
            PidState::Alive(_) => Ok(inst.answers()),
            PidState::Stale(pid) => Err(anyhow!(
                "{} exited during startup (pid {pid}); last lines of {}:\n{}",
                inst.name,
                inst.log_file().display(),
                process::log_tail(&inst.log_file(), 20)
            )),
            PidState::Foreign(pid) if begun.elapsed() > Duration::from_secs(5) => Err(anyhow!(
                "{}: pid {pid} from {} runs some other program",
                inst.name,
                inst.pid_file().display()
            )),
            PidState::Missing if begun.elapsed() > Duration::from_secs(5) => Err(anyhow!(
                "{} wrote no pid file within 5 s; last lines of {}:\n{}",
                inst.name,
                inst.log_file().display(),
                process::log_tail(&inst.log_file(), 20)
            )),
            PidState::Missing | PidState::Foreign(_) => Ok(false),
        },
    )
}

/// Starts (if needed) every instance of a group, then waits for each to answer.
/// Returns true if any instance had to be started or waited for.
fn start_group(group: &[&Instance], start: impl Fn(&Instance) -> Result<()>) -> Result<bool> {
    let mut waited = false;
    let mut pending = Vec::new();
    for inst in group {
        match ensure_started(inst, || start(inst))? {
            Start::AlreadyUp => {}
            Start::Running | Start::Started => pending.push(*inst),
        }
    }
    for inst in pending {
        wait_ready(inst)?;
        waited = true;
    }
    Ok(waited)
}

/// `services up`: install, start what is not running, wait, then print the environment
/// (when `print` is set).
pub(crate) fn up(print: bool) -> Result<()> {
    let begun = Instant::now();
    let root = services_root();
    process::ensure_dir(&root)?;
    let tools = install::ensure_installed(&root.join("apt.log"))?;
    let all = instances(&root);
    let select = |pred: &dyn Fn(&Instance) -> bool| all.iter().filter(|i| pred(i)).collect();
    let single: Vec<&Instance> = select(&|i| i.name == "redis");
    let redlock: Vec<&Instance> = select(&|i| i.name.starts_with("redlock-"));
    let cluster: Vec<&Instance> = select(&|i| i.kind == Kind::Redis { cluster: true });
    let maria: Vec<&Instance> = select(&|i| i.kind == Kind::MariaDb);
    let zk: Vec<&Instance> = select(&|i| i.kind == Kind::ZooKeeper { myid: None });
    let ensemble: Vec<&Instance> = select(&|i| matches!(i.kind, Kind::ZooKeeper { myid: Some(_) }));

    type Job<'a> = Box<dyn FnOnce() -> Result<bool> + Send + 'a>;
    let tools = &tools;
    let jobs: Vec<(&str, Job<'_>)> = vec![
        ("redis", Box::new(|| redis::up_plain(tools, &single))),
        ("redlock", Box::new(|| redis::up_plain(tools, &redlock))),
        (
            "redis-cluster",
            Box::new(|| redis::up_cluster(tools, &cluster, &root.join("redis-cluster"))),
        ),
        ("mariadb", Box::new(|| mariadb::up(tools, &maria))),
        ("zookeeper", Box::new(|| zookeeper::up(tools, &zk))),
        ("zk-ensemble", Box::new(|| zookeeper::up(tools, &ensemble))),
    ];
    let results: Vec<(&str, Result<bool>, Duration)> = thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(name, job)| {
                let handle = scope.spawn(move || {
                    let t = Instant::now();
                    let result = job();
                    (result, t.elapsed())
                });
                (name, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(name, handle)| match handle.join() {
                Ok((result, took)) => (name, result, took),
                Err(_) => (name, Err(anyhow!("thread panicked")), Duration::ZERO),
            })
            .collect()
    });

    let mut errors = Vec::new();
    for (name, result, took) in results {
        match result {
            Ok(true) => eprintln!("xtask: {name} ready ({:.2}s)", took.as_secs_f64()),
            Ok(false) => {}
            Err(err) => errors.push(format!("{name}: {err:#}")),
        }
    }
    if !errors.is_empty() {
        bail!("services up failed:\n{}", errors.join("\n"));
    }
    eprintln!(
        "xtask: services up ({:.2}s; state in {})",
        begun.elapsed().as_secs_f64(),
        root.display()
    );
    if print {
        print_env();
    }
    Ok(())
}

/// `services down`: stops every instance that has a pid file; keeps the data.
pub(crate) fn down() -> Result<()> {
    let root = services_root();
    let all = instances(&root);
    let redis_cli = install::find_program("redis-cli");
    let results: Vec<(String, Result<Option<u32>>)> = thread::scope(|scope| {
        let handles: Vec<_> = all
            .iter()
            .map(|inst| {
                let redis_cli = redis_cli.as_deref();
                (inst, scope.spawn(move || stop(inst, redis_cli)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(inst, h)| {
                let result = h.join().unwrap_or_else(|_| Err(anyhow!("thread panicked")));
                (inst.name.clone(), result)
            })
            .collect()
    });
    let mut errors = Vec::new();
    for (name, result) in results {
        match result {
            Ok(Some(pid)) => eprintln!("xtask: stopped {name} (pid {pid})"),
            Ok(None) => {}
            Err(err) => errors.push(format!("{name}: {err:#}")),
        }
    }
    if !errors.is_empty() {
        bail!("services down failed:\n{}", errors.join("\n"));
    }
    Ok(())
}

/// Stops one instance if its pid file names a live process; removes the pid file.
/// Returns the pid it stopped.
fn stop(inst: &Instance, redis_cli: Option<&Path>) -> Result<Option<u32>> {
    let stopped = match inst.pid_state() {
        PidState::Missing => return Ok(None),
        PidState::Stale(_) | PidState::Foreign(_) => None,
        PidState::Alive(pid) => {
            match inst.kind {
                Kind::Redis { .. } => redis::stop(inst, pid, redis_cli)?,
                Kind::MariaDb => process::terminate(pid, Duration::from_secs(60))?,
                Kind::ZooKeeper { .. } => process::terminate(pid, Duration::from_secs(10))?,
            }
            Some(pid)
        }
    };
    process::remove_file(&inst.pid_file())?;
    Ok(stopped)
}

/// `services status`: a table of instance, port, pid and state.
pub(crate) fn status() -> Result<()> {
    let root = services_root();
    let all = instances(&root);
    let rows: Vec<[String; 4]> = thread::scope(|scope| {
        let handles: Vec<_> = all
            .iter()
            .map(|inst| {
                scope.spawn(move || {
                    let (pid, state) = match inst.pid_state() {
                        PidState::Missing => ("-".to_string(), "down".to_string()),
                        PidState::Stale(pid) | PidState::Foreign(pid) => {
                            (pid.to_string(), "down (stale pid file)".to_string())
                        }
                        PidState::Alive(pid) => {
                            let state = if inst.answers() {
                                match inst.kind {
                                    Kind::ZooKeeper { .. } => zookeeper::mode(inst.port)
                                        .map_or_else(|| "up".to_string(), |m| format!("up ({m})")),
                                    _ => "up".to_string(),
                                }
                            } else {
                                "running, not answering".to_string()
                            };
                            (pid.to_string(), state)
                        }
                    };
                    [inst.name.clone(), inst.port.to_string(), pid, state]
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    [
                        "?".to_string(),
                        "?".to_string(),
                        "?".to_string(),
                        "?".to_string(),
                    ]
                })
            })
            .collect()
    });
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(["instance", "port", "pid", "state"]);
    for row in rows {
        table.add_row(row);
    }
    println!("{table}");
    println!("state: {}", root.display());
    Ok(())
}
