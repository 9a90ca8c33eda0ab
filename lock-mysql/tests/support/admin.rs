//! The server administrator's tools that need `root` (over the server's socket, from
//! `LOCK_TEST_SERVICES_DIR`): global variables set for as short a time as possible and always
//! restored, and throw-away users with limits of their own.
//!
//! Other test runs share the server: a global setting is restored when its guard drops, even
//! when the case fails or is dropped at its time limit (the restore runs synchronously, through
//! the `mariadb` command-line client).

use std::{path::PathBuf, process::Command};

use conformance_tests::{Failure, faults::Instance};

/// The server's socket, where `root` logs in without a password.
fn socket() -> Result<PathBuf, String> {
    let mariadb = Instance::named("mariadb").map_err(|Failure(why)| why)?;
    let path = mariadb.dir().join("mysqld.sock");
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    Ok(path)
}

/// Runs `sql` as `root` and returns what it printed (tab-separated, no headers).
pub fn root_sql(sql: &str) -> Result<String, String> {
    let out = Command::new("mariadb")
        .arg("--no-defaults")
        .arg("-uroot")
        .arg(format!("--socket={}", socket()?.display()))
        .args(["-N", "-B", "-e", sql])
        .output()
        .map_err(|e| format!("running mariadb as root: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "root: {sql}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A global variable set to a test value until this guard drops.
#[derive(Debug)]
pub struct GlobalSetting {
    name: &'static str,
    old: String,
}

impl GlobalSetting {
    /// Sets `name` to `value` globally (remembering the value it had).
    pub fn set(name: &'static str, value: &str) -> Result<Self, String> {
        let old = root_sql(&format!("SELECT @@GLOBAL.{name}"))?;
        root_sql(&format!("SET GLOBAL {name} = {value}"))?;
        Ok(Self { name, old })
    }

    /// Restores the old value now, reporting a failure.
    pub fn restore(self) -> Result<(), String> {
        let result = root_sql(&format!("SET GLOBAL {} = {}", self.name, self.old));
        std::mem::forget(self);
        result.map(drop)
    }
}

impl Drop for GlobalSetting {
    fn drop(&mut self) {
        if let Err(e) = root_sql(&format!("SET GLOBAL {} = {}", self.name, self.old)) {
            eprintln!("could not restore {}: {e}", self.name);
        }
    }
}

/// A user of this run with the `lock` user's rights on the test database and extra `limits`
/// (such as `MAX_STATEMENT_TIME 0.5`), dropped when this guard drops.
#[derive(Debug)]
pub struct TempUser {
    pub name: String,
    pub password: String,
}

impl TempUser {
    /// Creates the user for TCP logins from 127.0.0.1 on `database`.
    pub fn create(database: &str, limits: &str) -> Result<Self, String> {
        let name = format!("t{}_{:08x}", std::process::id(), rand::random::<u32>());
        let password = format!("{:016x}", rand::random::<u64>());
        let user = Self { name, password };
        root_sql(&format!(
            "CREATE USER '{0}'@'127.0.0.1' IDENTIFIED BY '{1}' WITH {limits}; \
             GRANT ALL PRIVILEGES ON `{database}`.* TO '{0}'@'127.0.0.1'",
            user.name, user.password
        ))?;
        Ok(user)
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = root_sql(&format!("DROP USER IF EXISTS '{}'@'127.0.0.1'", self.name));
    }
}
