//! Process plumbing: pid files, detached spawning, waiting with deadlines, stopping,
//! and the generated `start`/`stop` shell scripts.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Name of the pid file inside every instance directory.
pub(crate) const PID_FILE: &str = "pid";

/// How long `up` waits for one instance (or group) to answer.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What a pid file tells about its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PidState {
    /// No pid file.
    Missing,
    /// A pid file whose process is gone.
    Stale(u32),
    /// A pid file whose process is alive but runs some other program: either the pid was
    /// reused, or the process is in the middle of `execve` (right after we spawned it, the
    /// kernel may show an empty command line for a moment).
    Foreign(u32),
    /// A pid file whose process is alive and is the expected program.
    Alive(u32),
}

/// Reads a pid file; `None` if absent or unparsable.
pub(crate) fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes a pid file.
pub(crate) fn write_pid(path: &Path, pid: u32) -> Result<()> {
    fs::write(path, format!("{pid}\n")).with_context(|| format!("writing {}", path.display()))
}

/// Removes a file, ignoring "not found".
pub(crate) fn remove_file(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(err).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// True if `pid` exists and is not a zombie (our parent may not reap orphans).
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Format: "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X' | 'x'))
}

/// The command line of `pid`, arguments joined with spaces.
fn cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        String::from_utf8_lossy(&raw)
            .split('\0')
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Looks at a pid file: is its process alive, and is its command line the expected one
/// (every string of `expect` must occur in it, guarding against reused pids)?
pub(crate) fn pid_state(pid_file: &Path, expect: &[String]) -> PidState {
    // A server rewriting its pid file (truncate, write) can be caught half-way: re-read.
    let pid = read_pid(pid_file).or_else(|| {
        thread::sleep(Duration::from_millis(50));
        read_pid(pid_file)
    });
    let Some(pid) = pid else {
        return if pid_file.exists() {
            PidState::Stale(0)
        } else {
            PidState::Missing
        };
    };
    if !process_alive(pid) {
        return PidState::Stale(pid);
    }
    match cmdline(pid) {
        Some(line) if expect.iter().all(|e| line.contains(e.as_str())) => PidState::Alive(pid),
        _ => PidState::Foreign(pid),
    }
}

/// Sends a signal (`"TERM"`, `"KILL"`, `"CONT"`, ...) with kill(1).
pub(crate) fn signal(pid: u32, sig: &str) -> Result<()> {
    let out = Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running kill")?;
    if !out.status.success() && process_alive(pid) {
        bail!(
            "kill -s {sig} {pid} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Waits until `pid` is gone; true if it went within `timeout`.
pub(crate) fn wait_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Stops `pid`: wakes it (in case a test left it SIGSTOPped), sends SIGTERM, waits up to
/// `grace`, then SIGKILL.
pub(crate) fn terminate(pid: u32, grace: Duration) -> Result<()> {
    if !process_alive(pid) {
        return Ok(());
    }
    signal(pid, "TERM")?;
    signal(pid, "CONT")?;
    if wait_exit(pid, grace) {
        return Ok(());
    }
    eprintln!("xtask: pid {pid} still alive after {grace:?}, sending SIGKILL");
    signal(pid, "KILL")?;
    if wait_exit(pid, Duration::from_secs(5)) {
        Ok(())
    } else {
        bail!("pid {pid} survived SIGKILL")
    }
}

/// Opens `log` for appending (creating it).
fn open_log(log: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))
}

/// Prepares `cmd` to run detached from us: its own process group (so a Ctrl-C in our
/// terminal does not reach it), stdin from /dev/null, stdout and stderr appended to `log`
/// (so it never holds our stdout/stderr open).
fn detach(cmd: &mut Command, log: &Path) -> Result<()> {
    let out = open_log(log)?;
    let err = out.try_clone().context("duplicating log handle")?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0);
    Ok(())
}

/// Spawns `argv` in the background, detached (see [`detach`]), with working directory
/// `cwd`; returns its pid. The process outlives us.
pub(crate) fn spawn_detached(argv: &[String], cwd: &Path, log: &Path) -> Result<u32> {
    let (program, args) = argv.split_first().context("empty command line")?;
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(cwd);
    detach(&mut cmd, log)?;
    let child = cmd
        .spawn()
        .with_context(|| format!("spawning {}", shell_line(argv)))?;
    // Dropping a `Child` neither waits for nor kills it.
    Ok(child.id())
}

/// Runs `argv` to completion (killing it after `timeout`) with output appended to `log`;
/// fails with the tail of the log if it exits non-zero.
pub(crate) fn run_logged(argv: &[String], log: &Path, timeout: Duration) -> Result<()> {
    let (program, args) = argv.split_first().context("empty command line")?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    detach(&mut cmd, log)?;
    if let Ok(mut f) = open_log(log) {
        // Best effort: a marker in the log to find this run's output.
        let _ = writeln!(f, "+ {}", shell_line(argv));
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawning {}", shell_line(argv)))?;
    let status = wait_child(&mut child, timeout)
        .with_context(|| format!("{} (log: {})", shell_line(argv), log.display()))?;
    if !status.success() {
        bail!(
            "`{}` failed ({status}); last lines of {}:\n{}",
            shell_line(argv),
            log.display(),
            log_tail(log, 20)
        );
    }
    Ok(())
}

/// Output of [`run_capture`].
#[derive(Debug)]
pub(crate) struct Captured {
    /// Exit status.
    pub(crate) status: ExitStatus,
    /// Standard output.
    pub(crate) stdout: String,
    /// Standard error.
    pub(crate) stderr: String,
}

/// Runs `cmd` with stdout and stderr captured, killing it after `timeout`.
pub(crate) fn run_capture(mut cmd: Command, timeout: Duration) -> Result<Captured> {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("spawning {what}"))?;
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .map(|pipe| {
        thread::spawn(move || {
            let mut buf = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut buf);
            }
            buf
        })
    })
    .collect();
    let status = wait_child(&mut child, timeout).with_context(|| what.clone())?;
    let mut texts = readers.into_iter().map(|r| r.join().unwrap_or_default());
    Ok(Captured {
        status,
        stdout: texts.next().unwrap_or_default(),
        stderr: texts.next().unwrap_or_default(),
    })
}

/// Waits for a child with a deadline, killing it on timeout.
fn wait_child(child: &mut std::process::Child, timeout: Duration) -> Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().context("waiting for child")? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {timeout:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `check` every 25 ms until it returns `Ok(true)`; fails if it returns an error or
/// if `timeout` passes, naming `what` and pointing at `log`.
pub(crate) fn wait_until(
    what: &str,
    log: &Path,
    timeout: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if check().with_context(|| format!("{what}: see {}", log.display()))? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{what} did not become ready within {timeout:?}; see {}; last lines:\n{}",
                log.display(),
                log_tail(log, 20)
            );
        }
        thread::sleep(Duration::from_millis(25));
    }
}

/// The last `lines` lines of a log file (empty if unreadable).
pub(crate) fn log_tail(log: &Path, lines: usize) -> String {
    let Ok(bytes) = fs::read(log) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The loopback address at `port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Connects to 127.0.0.1:`port` with short connect/read/write timeouts.
pub(crate) fn connect(port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&loopback(port), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// True if something accepts TCP connections on 127.0.0.1:`port`.
pub(crate) fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(&loopback(port), Duration::from_millis(200)).is_ok()
}

/// Quotes one word for POSIX sh (only when needed).
pub(crate) fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// A command line as a shell-evalable string.
pub(crate) fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Shell helpers shared by the generated scripts: `alive PID` (running and not a zombie)
/// and `wait_gone PID TENTHS` (wait for exit, up to TENTHS tenths of a second).
pub(crate) const SCRIPT_HELPERS: &str = r#"alive() {
    st=$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$1/stat" 2>/dev/null)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
wait_gone() {
    i=0
    while alive "$1"; do
        i=$((i + 1))
        [ "$i" -ge "$2" ] && return 1
        sleep 0.1
    done
    return 0
}
"#;

/// Writes an executable script at `path` (a shebang line and `body`).
pub(crate) fn write_script(path: &Path, shell: &str, body: &str) -> Result<()> {
    let text = format!(
        "#!{shell}\n# Generated by `cargo xtask services up`; rewritten on every run.\nset -u\n{body}"
    );
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", path.display()))
}

/// Creates a directory and its parents.
pub(crate) fn ensure_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc/d:1"), "abc/d:1");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn own_process_is_alive() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX - 1));
    }
}
