//! MariaDB: one server on 13306 with the `locktest` database and the `lock` user.

use std::io::Read;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::install::Tools;
use super::process::{self, shell_line, shell_quote};
use super::{Instance, MYSQL_DATABASE, MYSQL_PASSWORD, MYSQL_USER, start_group};

/// Marker written once `mariadb-install-db` has completed.
const INITIALIZED_MARKER: &str = ".initialized";

/// `<dir>/mysqld.err` (the server's `--log-error`; its stdout/stderr go there too).
pub(super) fn log_file(inst: &Instance) -> PathBuf {
    inst.dir.join("mysqld.err")
}

/// `<dir>/data`.
fn data_dir(inst: &Instance) -> PathBuf {
    inst.dir.join("data")
}

/// `<dir>/mysqld.sock`.
fn socket(inst: &Instance) -> PathBuf {
    inst.dir.join("mysqld.sock")
}

/// The server's command line contains its program name and our data directory.
pub(super) fn expected_cmdline(inst: &Instance) -> Vec<String> {
    vec![
        "mariadbd".to_string(),
        format!("--datadir={}", data_dir(inst).display()),
    ]
}

/// The command line that starts the server (in the foreground; we detach it).
fn argv(tools: &Tools, inst: &Instance) -> Vec<String> {
    vec![
        tools.mariadbd.display().to_string(),
        "--no-defaults".to_string(),
        "--user=root".to_string(),
        format!("--datadir={}", data_dir(inst).display()),
        format!("--socket={}", socket(inst).display()),
        format!("--pid-file={}", inst.pid_file().display()),
        format!("--log-error={}", log_file(inst).display()),
        "--bind-address=127.0.0.1".to_string(),
        format!("--port={}", inst.port),
        "--skip-name-resolve".to_string(),
        "--max-connections=5000".to_string(),
    ]
}

/// The command line that initialises the data directory.
fn install_db_argv(tools: &Tools, inst: &Instance) -> Vec<String> {
    vec![
        tools.mariadb_install_db.display().to_string(),
        "--no-defaults".to_string(),
        "--user=root".to_string(),
        format!("--datadir={}", data_dir(inst).display()),
        "--auth-root-authentication-method=normal".to_string(),
        "--skip-test-db".to_string(),
    ]
}

/// The SQL that creates the test database and user (idempotent).
fn setup_sql() -> String {
    format!(
        "CREATE DATABASE IF NOT EXISTS `{MYSQL_DATABASE}`; \
         CREATE USER IF NOT EXISTS '{MYSQL_USER}'@'127.0.0.1' IDENTIFIED BY '{MYSQL_PASSWORD}'; \
         GRANT ALL ON `{MYSQL_DATABASE}`.* TO '{MYSQL_USER}'@'127.0.0.1';"
    )
}

/// The root client over the socket: `mariadb --no-defaults -uroot --socket=...`.
fn root_client(tools: &Tools, inst: &Instance) -> Vec<String> {
    vec![
        tools.mariadb.display().to_string(),
        "--no-defaults".to_string(),
        "-uroot".to_string(),
        format!("--socket={}", socket(inst).display()),
    ]
}

/// Writes `<dir>/start` and `<dir>/stop`.
fn write_scripts(tools: &Tools, inst: &Instance) -> Result<()> {
    let dir = shell_quote(&inst.dir.display().to_string());
    let log = shell_quote(&log_file(inst).display().to_string());
    let admin = shell_line(&[
        tools.mariadb_admin.display().to_string(),
        "--no-defaults".to_string(),
        "-uroot".to_string(),
        format!("--socket={}", socket(inst).display()),
        "--connect-timeout=1".to_string(),
    ]);
    let helpers = process::SCRIPT_HELPERS;
    let port = inst.port;
    let start = format!(
        r#"# Starts MariaDB on port {port} in the background and waits until it answers
# (unless --no-wait). The data directory must exist (`cargo xtask services up` creates it).
{helpers}dir={dir}
pid=$(cat "$dir/pid" 2>/dev/null || true)
if [ -n "$pid" ] && alive "$pid"; then echo "mariadb: already running (pid $pid)"; exit 0; fi
rm -f "$dir/pid"
cd "$dir" || exit 1
setsid {cmd} >>{log} 2>&1 </dev/null &
echo $! >"$dir/pid"
[ "${{1:-}}" = --no-wait ] && exit 0
i=0
until {admin} ping >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -ge 300 ]; then echo "mariadb: not answering after 30 s; see {log}" >&2; exit 1; fi
    sleep 0.1
done
"#,
        cmd = shell_line(&argv(tools, inst)),
    );
    let stop = format!(
        r#"# Stops MariaDB (SIGTERM), waits for the process to exit (SIGKILL after 60 s).
{helpers}dir={dir}
pid=$(cat "$dir/pid" 2>/dev/null || true)
if [ -z "$pid" ] || ! alive "$pid"; then rm -f "$dir/pid"; exit 0; fi
kill -TERM "$pid" 2>/dev/null
kill -CONT "$pid" 2>/dev/null
if ! wait_gone "$pid" 600; then kill -KILL "$pid" 2>/dev/null; wait_gone "$pid" 50; fi
rm -f "$dir/pid"
"#
    );
    process::write_script(&inst.dir.join("start"), "/bin/sh", &start)?;
    process::write_script(&inst.dir.join("stop"), "/bin/sh", &stop)
}

/// Initialises the data directory unless a previous run completed that.
fn init_data_dir(tools: &Tools, inst: &Instance) -> Result<()> {
    let marker = inst.dir.join(INITIALIZED_MARKER);
    if marker.exists() {
        return Ok(());
    }
    let data = data_dir(inst);
    if data.exists() {
        // A previous initialisation did not finish: start over.
        std::fs::remove_dir_all(&data).with_context(|| format!("removing {}", data.display()))?;
    }
    eprintln!("xtask: mariadb: initialising {}", data.display());
    process::run_logged(
        &install_db_argv(tools, inst),
        &inst.dir.join("install-db.log"),
        Duration::from_secs(120),
    )?;
    std::fs::write(&marker, "").with_context(|| format!("writing {}", marker.display()))
}

/// Starts the server in the background and records its pid.
fn start(tools: &Tools, inst: &Instance) -> Result<()> {
    init_data_dir(tools, inst)?;
    let pid = process::spawn_detached(&argv(tools, inst), &inst.dir, &log_file(inst))?;
    process::write_pid(&inst.pid_file(), pid)
}

/// Creates the database and the user over the socket.
fn create_user(tools: &Tools, inst: &Instance) -> Result<()> {
    let argv = root_client(tools, inst);
    let (program, args) = argv.split_first().context("empty command line")?;
    let mut cmd = Command::new(program);
    cmd.args(args).arg("-e").arg(setup_sql());
    let out = process::run_capture(cmd, Duration::from_secs(30))?;
    if !out.status.success() {
        bail!(
            "creating database/user failed ({}): {}{}",
            out.status,
            out.stdout.trim(),
            out.stderr.trim()
        );
    }
    Ok(())
}

/// Brings up MariaDB and makes sure the test database and user exist.
pub(super) fn up(tools: &Tools, group: &[&Instance]) -> Result<bool> {
    for inst in group {
        process::ensure_dir(&inst.dir)?;
        write_scripts(tools, inst)?;
    }
    let acted = start_group(group, |inst| start(tools, inst))?;
    for inst in group {
        create_user(tools, inst).with_context(|| format!("{} setup", inst.name))?;
    }
    Ok(acted)
}

/// True if a MariaDB/MySQL server on `port` sends its protocol-10 handshake.
pub(super) fn answers(port: u16) -> bool {
    let Ok(mut stream) = process::connect(port, Duration::from_millis(1000)) else {
        return false;
    };
    // Packet header (3 bytes length, 1 byte sequence), then the protocol version (10).
    // An error packet (0xff) means the server refuses us (e.g. still starting).
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).is_ok() && head[4] == 10
}
