//! The long steps of `cargo xtask compare`: each a child process (a cargo build, or a test or
//! benchmark binary) whose output goes to a log file of its own, shown on the terminal as one
//! progress bar over all steps (the step under way and the time it has taken) and one line per
//! step done, so nothing the children print reaches the terminal (their lines are wider than
//! the report's 100 columns).

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::report::fit;

/// The steps of one run.
#[derive(Debug)]
pub(crate) struct Steps {
    bar: ProgressBar,
    logs: PathBuf,
}

impl Steps {
    /// `total` steps, whose logs go into `logs` (emptied first).
    pub(crate) fn new(total: usize, logs: &Path) -> Result<Self> {
        if logs.exists() {
            std::fs::remove_dir_all(logs)
                .with_context(|| format!("clearing {}", logs.display()))?;
        }
        std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
        let bar = ProgressBar::new(u64::try_from(total).unwrap_or(u64::MAX));
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] [{bar:24}] {pos}/{len} {wide_msg}",
            )
            .context("the progress bar's template")?
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Ok(Self {
            bar,
            logs: logs.to_path_buf(),
        })
    }

    /// Runs `command` as the step `name` (its log is `<logs>/<file>.log`): whether it
    /// succeeded. A step that fails is reported with its log's path.
    pub(crate) fn run(&self, name: &str, file: &str, command: &mut Command) -> Result<bool> {
        let log = self.logs.join(format!("{file}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        self.bar.set_message(fit(name));
        let started = Instant::now();
        let status = command
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("running {name}"))?;
        let took = started.elapsed().as_secs();
        // The log's path from the workspace root: short enough for the line.
        let shown = log
            .strip_prefix(crate::workspace_root())
            .unwrap_or(&log)
            .display()
            .to_string();
        let line = if status.success() {
            format!("ok   {name} ({took} s)")
        } else {
            format!("FAIL {name} ({took} s): {shown}")
        };
        self.say(&fit(&line));
        self.bar.inc(1);
        Ok(status.success())
    }

    /// Prints `line` above the bar, or on its own when the bar is hidden (standard error is
    /// not a terminal: indicatif draws nothing then, `println` included).
    fn say(&self, line: &str) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// Ends the bar (it leaves the terminal).
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_logs_its_output_and_reports_failure() {
        let logs = std::env::temp_dir().join(format!("xtask-steps-{}", std::process::id()));
        let steps = Steps::new(2, &logs).unwrap();
        let ok = steps
            .run("say", "say", Command::new("sh").args(["-c", "echo said"]))
            .unwrap();
        let failed = steps
            .run(
                "fail",
                "fail",
                Command::new("sh").args(["-c", "echo why >&2; exit 3"]),
            )
            .unwrap();
        steps.finish();
        let said = std::fs::read_to_string(logs.join("say.log")).unwrap();
        let why = std::fs::read_to_string(logs.join("fail.log")).unwrap();
        std::fs::remove_dir_all(&logs).unwrap();
        assert!(ok && !failed);
        assert_eq!(said, "said\n");
        assert_eq!(why, "why\n");
    }
}
