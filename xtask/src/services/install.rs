//! Finding the server programs and installing the Debian packages that provide them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::process;

/// The ZooKeeper jar installed by Debian's `zookeeper` package.
pub(crate) const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// Directories searched for programs besides `$PATH` (sbin is not on every user's path).
const EXTRA_DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// Absolute paths of the programs the services need.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    /// `redis-server`.
    pub(crate) redis_server: PathBuf,
    /// `redis-cli`.
    pub(crate) redis_cli: PathBuf,
    /// `mariadbd`.
    pub(crate) mariadbd: PathBuf,
    /// `mariadb-install-db`.
    pub(crate) mariadb_install_db: PathBuf,
    /// `mariadb` (the client).
    pub(crate) mariadb: PathBuf,
    /// `mariadb-admin`.
    pub(crate) mariadb_admin: PathBuf,
    /// `java`.
    pub(crate) java: PathBuf,
    /// The ZooKeeper class path.
    pub(crate) zookeeper_classpath: String,
    /// `openssl`, which makes the TLS Redis's certificates.
    pub(crate) openssl: PathBuf,
}

/// Finds `name` on `$PATH` or in the sbin/bin directories.
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// True for an executable regular file.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The Debian packages that provide what is missing, in install order.
fn missing_packages() -> Vec<&'static str> {
    let mut packages = Vec::new();
    if find_program("redis-server").is_none() || find_program("redis-cli").is_none() {
        packages.extend(["redis-server", "redis-tools"]);
    }
    if ["mariadbd", "mariadb-install-db", "mariadb", "mariadb-admin"]
        .iter()
        .any(|p| find_program(p).is_none())
    {
        packages.extend(["mariadb-server", "mariadb-client"]);
    }
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        packages.push("zookeeper");
    }
    // Not a server: makes the certificates of the TLS Redis.
    if find_program("openssl").is_none() {
        packages.push("openssl");
    }
    // Not a server: the MySQL fault tests run lock clients whose clock is minutes off.
    if find_program("faketime").is_none() {
        packages.push("faketime");
    }
    // Not a server: the MySQL benchmark's peer, distributed-lock-mysql, builds sqlx 0.8 with
    // native-tls, which links OpenSSL found by pkg-config (the tests build it too).
    if !openssl_headers() {
        packages.extend(["pkg-config", "libssl-dev"]);
    }
    // Not a server: xtask's test of the compare report opens it in headless Chromium.
    if find_program("chromium").is_none() {
        packages.push("chromium");
    }
    packages
}

/// True when pkg-config runs and finds OpenSSL's development files.
fn openssl_headers() -> bool {
    Command::new("pkg-config")
        .args(["--exists", "openssl"])
        .status()
        .is_ok_and(|status| status.success())
}

/// True if we run as root (`id -u` prints 0).
fn is_root() -> Result<bool> {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .context("running `id -u`")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Installs the missing packages with apt-get (as root), then returns the tool paths.
/// `log` receives apt-get's output.
pub(crate) fn ensure_installed(log: &Path) -> Result<Tools> {
    let packages = missing_packages();
    if !packages.is_empty() {
        let list = packages.join(" ");
        if !is_root()? {
            bail!(
                "missing packages: {list}. Install them as root with:\n  \
                 apt-get update && apt-get install -y --no-install-recommends {list}"
            );
        }
        let started = Instant::now();
        eprintln!(
            "xtask: installing {list} (apt-get; output in {})",
            log.display()
        );
        apt_get(&["update", "-q"], log)?;
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend(&packages);
        apt_get(&args, log)?;
        eprintln!(
            "xtask: installed {list} in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let still = missing_packages();
        if !still.is_empty() {
            bail!(
                "after apt-get install, still missing what {} provide",
                still.join(" ")
            );
        }
    }
    tools()
}

/// Runs `apt-get ARGS` non-interactively with output appended to `log`.
fn apt_get(args: &[&str], log: &Path) -> Result<()> {
    let mut argv = vec![
        "env".to_string(),
        "DEBIAN_FRONTEND=noninteractive".to_string(),
    ];
    argv.push("apt-get".to_string());
    argv.extend(args.iter().map(|a| (*a).to_string()));
    process::run_logged(&argv, log, Duration::from_secs(900))
}

/// Resolves every tool path, failing with what is missing.
fn tools() -> Result<Tools> {
    let need = |name: &str| {
        find_program(name).with_context(|| format!("`{name}` not found on PATH or in /usr/sbin"))
    };
    Ok(Tools {
        redis_server: need("redis-server")?,
        redis_cli: need("redis-cli")?,
        mariadbd: need("mariadbd")?,
        mariadb_install_db: need("mariadb-install-db")?,
        mariadb: need("mariadb")?,
        mariadb_admin: need("mariadb-admin")?,
        java: need("java")?,
        zookeeper_classpath: zookeeper_classpath()?,
        openssl: need("openssl")?,
    })
}

/// The class path for ZooKeeper's `QuorumPeerMain`: Debian's conf directory, the
/// ZooKeeper jar (its manifest `Class-Path` pulls in the jars it links against) and the
/// slf4j API plus the simple binding, so the server logs to stderr (our log file).
fn zookeeper_classpath() -> Result<String> {
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        bail!("{ZOOKEEPER_JAR} not found (package `zookeeper`)");
    }
    let mut parts: Vec<&str> = Vec::new();
    if Path::new("/etc/zookeeper/conf").is_dir() {
        parts.push("/etc/zookeeper/conf");
    }
    parts.push(ZOOKEEPER_JAR);
    for jar in [
        "/usr/share/java/slf4j-api.jar",
        "/usr/share/java/slf4j-simple.jar",
    ] {
        if Path::new(jar).is_file() {
            parts.push(jar);
        }
    }
    Ok(parts.join(":"))
}
