//! Redis: the single server, the five Redlock servers and the three-master cluster.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::install::Tools;
use super::process::{self, shell_line, shell_quote};
use super::{Instance, Kind, redis_tls, start_group};

/// Timeout of one health-check round trip.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// Slots in a Redis Cluster.
const CLUSTER_SLOTS: u32 = 16384;

/// `<dir>/redis.log`.
pub(super) fn log_file(inst: &Instance) -> PathBuf {
    inst.dir.join("redis.log")
}

/// Redis renames its process to `redis-server 127.0.0.1:PORT`.
pub(super) fn expected_cmdline(inst: &Instance) -> Vec<String> {
    vec![
        "redis-server".to_string(),
        format!("127.0.0.1:{}", inst.port),
    ]
}

/// The command line that starts `inst` (Redis daemonizes itself and writes `<dir>/pid`).
fn argv(tools: &Tools, inst: &Instance) -> Vec<String> {
    let dir = inst.dir.display().to_string();
    let mut argv: Vec<String> = vec![tools.redis_server.display().to_string()];
    let mut opt = |k: &str, v: &str| {
        argv.push(format!("--{k}"));
        argv.push(v.to_string());
    };
    opt("port", &inst.port.to_string());
    opt("bind", "127.0.0.1");
    opt("daemonize", "yes");
    opt("save", "");
    opt("appendonly", "no");
    opt("dir", &dir);
    opt("pidfile", &inst.pid_file().display().to_string());
    opt("logfile", &log_file(inst).display().to_string());
    // Lets fault tests use DEBUG SLEEP etc. from loopback.
    opt("enable-debug-command", "local");
    if inst.kind == (Kind::Redis { cluster: true }) {
        opt("cluster-enabled", "yes");
        opt(
            "cluster-config-file",
            &inst.dir.join("nodes.conf").display().to_string(),
        );
        opt("cluster-node-timeout", "2000");
    }
    if let Some(port) = inst.tls_port {
        argv.extend(redis_tls::args(inst, port));
    }
    argv
}

/// Writes `<dir>/start` and `<dir>/stop`.
fn write_scripts(tools: &Tools, inst: &Instance) -> Result<()> {
    let dir = shell_quote(&inst.dir.display().to_string());
    let cli = shell_quote(&tools.redis_cli.display().to_string());
    let port = inst.port;
    let helpers = process::SCRIPT_HELPERS;
    let start = format!(
        r#"# Starts Redis on port {port} and waits until it answers PING (unless --no-wait).
{helpers}dir={dir}
pid=$(cat "$dir/pid" 2>/dev/null || true)
if [ -n "$pid" ] && alive "$pid"; then echo "redis {port}: already running (pid $pid)"; exit 0; fi
rm -f "$dir/pid"
{cmd} || exit 1
[ "${{1:-}}" = --no-wait ] && exit 0
i=0
until {cli} -p {port} ping 2>/dev/null | grep -q PONG; do
    i=$((i + 1))
    if [ "$i" -ge 300 ]; then echo "redis {port}: not answering after 30 s; see $dir/redis.log" >&2; exit 1; fi
    sleep 0.1
done
"#,
        cmd = shell_line(&argv(tools, inst)),
    );
    let stop = format!(
        r#"# Stops Redis on port {port} (SHUTDOWN NOSAVE), waits for the process to exit.
{helpers}dir={dir}
pid=$(cat "$dir/pid" 2>/dev/null || true)
if [ -z "$pid" ] || ! alive "$pid"; then rm -f "$dir/pid"; exit 0; fi
kill -CONT "$pid" 2>/dev/null
{cli} -p {port} shutdown nosave >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null
if ! wait_gone "$pid" 100; then kill -KILL "$pid" 2>/dev/null; wait_gone "$pid" 50; fi
rm -f "$dir/pid"
"#
    );
    process::write_script(&inst.dir.join("start"), "/bin/sh", &start)?;
    process::write_script(&inst.dir.join("stop"), "/bin/sh", &stop)
}

/// Starts one Redis (it daemonizes: the launcher returns at once).
fn start(tools: &Tools, inst: &Instance) -> Result<()> {
    process::run_logged(&argv(tools, inst), &log_file(inst), Duration::from_secs(10))
}

/// Prepares the directory, scripts and (for a TLS port) certificates of each instance, and
/// stops one that runs without the TLS port it should have, so it starts again with it.
fn prepare(tools: &Tools, group: &[&Instance]) -> Result<()> {
    for inst in group {
        process::ensure_dir(&inst.dir)?;
        write_scripts(tools, inst)?;
        if let Some(port) = inst.tls_port {
            redis_tls::ensure_certificates(tools, inst)?;
            if let (true, process::PidState::Alive(pid)) =
                (tls_missing(inst, port), inst.pid_state())
            {
                eprintln!("xtask: {}: restarting it with TLS on {port}", inst.name);
                stop(inst, pid, Some(&tools.redis_cli))?;
            }
        }
    }
    Ok(())
}

/// Brings up independent Redis servers. True if anything had to be started.
pub(super) fn up_plain(tools: &Tools, group: &[&Instance]) -> Result<bool> {
    prepare(tools, group)?;
    start_group(group, |inst| start(tools, inst))
}

/// Brings up the cluster nodes, forms the cluster if it is not formed, and waits until
/// every node reports `cluster_state:ok`. True if anything had to be done.
pub(super) fn up_cluster(tools: &Tools, nodes: &[&Instance], cluster_dir: &Path) -> Result<bool> {
    prepare(tools, nodes)?;
    write_cluster_scripts(nodes, cluster_dir)?;
    let mut acted = start_group(nodes, |inst| start(tools, inst))?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let log = cluster_dir.join("cluster.log");
    if all_ok(&ports) {
        return Ok(acted);
    }
    let infos = ports
        .iter()
        .map(|p| cluster_info(*p))
        .collect::<Result<Vec<_>>>()?;
    let field = |info: &HashMap<String, String>, key: &str| -> u32 {
        info.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    let fresh = infos
        .iter()
        .all(|i| field(i, "cluster_known_nodes") <= 1 && field(i, "cluster_slots_assigned") == 0);
    let formed = infos.iter().all(|i| {
        field(i, "cluster_known_nodes") as usize == ports.len()
            && field(i, "cluster_slots_assigned") == CLUSTER_SLOTS
    });
    if !formed {
        if !fresh {
            eprintln!(
                "xtask: redis-cluster: half-formed cluster found; resetting the nodes and \
                 creating it again"
            );
            for port in &ports {
                command(*port, &["FLUSHALL"])?;
                command(*port, &["CLUSTER", "RESET", "HARD"])?;
            }
        }
        eprintln!("xtask: redis-cluster: creating the cluster");
        let mut argv = vec![
            tools.redis_cli.display().to_string(),
            "--cluster".to_string(),
            "create".to_string(),
        ];
        argv.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        argv.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        process::run_logged(&argv, &log, Duration::from_secs(60))?;
    }
    process::wait_until(
        "redis-cluster (cluster_state:ok)",
        &log,
        process::READY_TIMEOUT,
        || Ok(all_ok(&ports)),
    )?;
    acted = true;
    Ok(acted)
}

/// Writes `redis-cluster/start` and `redis-cluster/stop`, which run every node's script.
fn write_cluster_scripts(nodes: &[&Instance], cluster_dir: &Path) -> Result<()> {
    let each = |script: &str| {
        nodes
            .iter()
            .map(|n| {
                format!(
                    "{} \"$@\" || rc=1\n",
                    shell_quote(&n.dir.join(script).display().to_string())
                )
            })
            .collect::<String>()
    };
    let body = |what: &str, script: &str| {
        format!(
            "# {what} every Redis Cluster node (the cluster re-forms from nodes.conf).\n\
             rc=0\n{}exit $rc\n",
            each(script)
        )
    };
    process::write_script(
        &cluster_dir.join("start"),
        "/bin/sh",
        &body("Starts", "start"),
    )?;
    process::write_script(&cluster_dir.join("stop"), "/bin/sh", &body("Stops", "stop"))
}

/// True if every port reports `cluster_state:ok`.
fn all_ok(ports: &[u16]) -> bool {
    ports.iter().all(|p| {
        cluster_info(*p).is_ok_and(|info| info.get("cluster_state").is_some_and(|s| s == "ok"))
    })
}

/// `CLUSTER INFO` as a map.
fn cluster_info(port: u16) -> Result<HashMap<String, String>> {
    let text = command(port, &["CLUSTER", "INFO"])?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

/// True when `inst` answers on its plain port but not on its TLS `port`: started before TLS
/// was configured, so it must be restarted.
fn tls_missing(inst: &Instance, port: u16) -> bool {
    answers(inst.port) && !process::port_open(port)
}

/// True if Redis on `port` answers PING with PONG.
pub(super) fn answers(port: u16) -> bool {
    command(port, &["PING"]).is_ok_and(|r| r == "PONG")
}

/// Sends one command over RESP and returns a simple-string, integer or bulk reply as text.
/// An error reply becomes an error.
fn command(port: u16, args: &[&str]) -> Result<String> {
    let stream = process::connect(port, PROBE_TIMEOUT)
        .with_context(|| format!("connecting to redis on {port}"))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    (&stream).write_all(request.as_bytes())?;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end();
    let (kind, rest) = line.split_at(line.len().min(1));
    match kind {
        "+" | ":" => Ok(rest.to_string()),
        "-" => bail!("redis {port}: {rest}"),
        "$" => {
            let len: i64 = rest.parse().context("bad bulk length")?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(String::new());
            };
            let mut buf = vec![0; len + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(len);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        _ => bail!("redis {port}: unexpected reply {line:?}"),
    }
}

/// Stops the Redis whose live pid is `pid`: `redis-cli -p PORT shutdown nosave`, falling
/// back to signals.
pub(super) fn stop(inst: &Instance, pid: u32, redis_cli: Option<&Path>) -> Result<()> {
    // Wake it first in case a test stopped it with SIGSTOP.
    process::signal(pid, "CONT")?;
    if let Some(cli) = redis_cli {
        let mut cmd = std::process::Command::new(cli);
        cmd.args(["-p", &inst.port.to_string(), "shutdown", "nosave"]);
        // The reply is the connection closing; the exit status does not matter.
        let _ = process::run_capture(cmd, Duration::from_secs(10));
        if process::wait_exit(pid, Duration::from_secs(10)) {
            return Ok(());
        }
    }
    process::terminate(pid, Duration::from_secs(10))
}
