//! The servers of `cargo xtask services`, taken away and given back.
//!
//! Each server is an instance: a directory under [`SERVICES_DIR_VAR`] with its `start` and
//! `stop` scripts (`start` returns once the server answers, `stop` once its process is gone)
//! and its `pid` file. A fault is a guard: [`Stopped`] starts its instances again and
//! [`Paused`] continues its process when dropped, so a case that fails or hangs past its time
//! limit leaves no server down for the cases after it.

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
};

use crate::{Failure, Outcome, faults::env_var};

/// The variable naming the directory of the service instances.
pub const SERVICES_DIR_VAR: &str = "LOCK_TEST_SERVICES_DIR";

/// One server of `cargo xtask services` (`redis`, `redlock-3`, `mariadb`, `zookeeper`,
/// `zk-ensemble-1`, ...).
#[derive(Debug, Clone)]
pub struct Instance {
    name: String,
    dir: PathBuf,
}

impl Instance {
    /// The instance `name` in the directory [`SERVICES_DIR_VAR`] names.
    ///
    /// # Errors
    /// When the variable is not set.
    pub fn named(name: &str) -> Result<Self, Failure> {
        let root = env_var(SERVICES_DIR_VAR)?;
        Ok(Self::in_root(Path::new(&root), name))
    }

    /// The instance `name` under `root`.
    pub(crate) fn in_root(root: &Path, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            dir: root.join(name),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its directory: scripts, `pid`, configuration and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The id of its process, from its `pid` file.
    ///
    /// # Errors
    /// When the file is missing or does not hold a number.
    pub fn pid(&self) -> Result<u32, Failure> {
        let path = self.dir.join("pid");
        std::fs::read_to_string(&path)
            .map_err(|e| Failure(format!("reading {}: {e}", path.display())))?
            .trim()
            .parse()
            .map_err(|e| Failure(format!("{}: {e}", path.display())))
    }

    /// Stops it (its `stop` script); the guard starts it again when dropped.
    ///
    /// # Errors
    /// When the script fails (the instance may then still run).
    pub async fn stop(&self) -> Result<Stopped, Failure> {
        self.run("stop").await?;
        Ok(Stopped {
            instances: vec![self.clone()],
        })
    }

    /// Starts it (its `start` script) and returns once it answers.
    ///
    /// # Errors
    /// When the script fails.
    pub async fn start(&self) -> Outcome {
        self.run("start").await
    }

    /// Pauses its process (SIGSTOP): it keeps its connections and answers nothing. The guard
    /// continues it (SIGCONT) when dropped.
    ///
    /// # Errors
    /// When its `pid` file cannot be read or the signal fails.
    pub fn pause(&self) -> Result<Paused, Failure> {
        Paused::process(self.pid()?)
    }

    /// Runs its script `script` (`start` or `stop`) to the end.
    pub(crate) async fn run(&self, script: &str) -> Outcome {
        let path = self.dir.join(script);
        let status = tokio::process::Command::new(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .await;
        checked(&path, status)
    }

    /// [`Instance::run`] without a runtime, for the guards' `Drop`.
    fn run_blocking(&self, script: &str) -> Outcome {
        let path = self.dir.join(script);
        let status = std::process::Command::new(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
        checked(&path, status)
    }
}

fn checked(path: &Path, status: std::io::Result<ExitStatus>) -> Outcome {
    let status = status.map_err(|e| Failure(format!("running {}: {e}", path.display())))?;
    if status.success() {
        Ok(())
    } else {
        Err(Failure(format!("{} exited with {status}", path.display())))
    }
}

/// Stopped instances, started again (in the order they were stopped) when the guard drops.
#[derive(Debug)]
#[must_use = "dropping the guard starts the instances again at once"]
pub struct Stopped {
    /// The instances not started again yet.
    instances: Vec<Instance>,
}

impl Stopped {
    /// Stops the instances `names`, one after another. When one fails, the guard of those
    /// already stopped is dropped, so they start again.
    ///
    /// # Errors
    /// When [`SERVICES_DIR_VAR`] is not set or a `stop` script fails.
    pub async fn instances(names: &[&str]) -> Result<Self, Failure> {
        let mut stopped = Self {
            instances: Vec::new(),
        };
        for name in names {
            let instance = Instance::named(name)?;
            instance.run("stop").await?;
            stopped.instances.push(instance);
        }
        Ok(stopped)
    }

    /// Starts the instances again, in order, each answering before the next starts.
    ///
    /// # Errors
    /// When a `start` script fails; the guard then still starts that instance and those after
    /// it as it drops.
    pub async fn start(mut self) -> Outcome {
        while let Some(instance) = self.instances.first() {
            instance.run("start").await?;
            self.instances.remove(0);
        }
        Ok(())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for instance in &self.instances {
            if let Err(e) = instance.run_blocking("start") {
                eprintln!("could not start {} again: {e}", instance.name);
            }
        }
    }
}

/// A process stopped with SIGSTOP, continued with SIGCONT when the guard drops.
#[derive(Debug)]
#[must_use = "dropping the guard continues the process at once"]
pub struct Paused {
    pid: u32,
    resumed: bool,
}

impl Paused {
    /// Pauses the process `pid`.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn process(pid: u32) -> Result<Self, Failure> {
        signal(pid, "STOP")?;
        Ok(Self {
            pid,
            resumed: false,
        })
    }

    /// The paused process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Continues the process now.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume(mut self) -> Outcome {
        self.resumed = true;
        signal(self.pid, "CONT")
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if !self.resumed
            && let Err(e) = signal(self.pid, "CONT")
        {
            eprintln!("could not continue process {}: {e}", self.pid);
        }
    }
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`, ...) to the process `pid`.
///
/// # Errors
/// When `kill` cannot run or fails (no such process, say).
pub fn signal(pid: u32, signal: &str) -> Outcome {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| Failure(format!("kill -{signal} {pid}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Failure(format!(
            "kill -{signal} {pid} exited with {status}"
        )))
    }
}
