//! [`SuiteReport`]: what one run of the suite against one store found, as data (JSON for
//! `cargo xtask compare`) and as text.

use std::{fmt, path::Path};

use lock_core::Capabilities;
use serde::{Deserialize, Serialize};

/// The verdict of one scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// It ran and passed.
    Pass,
    /// It ran and failed (or hung).
    Fail,
    /// The store's capabilities make it not apply.
    NotApplicable,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::NotApplicable => "n/a",
        })
    }
}

/// One scenario's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioResult {
    /// The scenario's name.
    pub scenario: String,
    /// The contract item it covers.
    pub covers: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Why it failed or does not apply; empty on a pass.
    pub detail: String,
    /// How long it ran, in milliseconds.
    pub millis: u64,
}

/// The results of the suite against one store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuiteReport {
    /// The store's label (a column of the comparison).
    pub store: String,
    /// The URL the store under test was declared with (password hidden), as
    /// `distributed_lock::connect` takes it; empty when the store has none.
    #[serde(default)]
    pub url: String,
    /// The backend's declared capabilities, when a client could be made.
    pub capabilities: Option<Capabilities>,
    /// Why the store could not be tested at all (it counts as a failure).
    pub error: Option<String>,
    /// One result per scenario.
    pub results: Vec<ScenarioResult>,
}

impl SuiteReport {
    /// Scenarios that passed.
    pub fn passed(&self) -> usize {
        self.count(Verdict::Pass)
    }

    /// Scenarios that failed, plus one if the store could not be set up.
    pub fn failed(&self) -> usize {
        self.count(Verdict::Fail) + usize::from(self.error.is_some())
    }

    /// Scenarios that do not apply.
    pub fn not_applicable(&self) -> usize {
        self.count(Verdict::NotApplicable)
    }

    /// The names of the failed scenarios.
    pub fn failures(&self) -> Vec<&str> {
        self.failed_results().map(|r| r.scenario.as_str()).collect()
    }

    /// One line per failure, `store/scenario: detail` (the set-up error counts as one), for
    /// the summary at the end of a run.
    pub fn failure_lines(&self) -> Vec<String> {
        let setup = self
            .error
            .iter()
            .map(|error| format!("{}: could not be set up: {error}", self.store));
        let scenarios = self
            .failed_results()
            .map(|r| format!("{}/{}: {}", self.store, r.scenario, r.detail));
        setup.chain(scenarios).collect()
    }

    fn failed_results(&self) -> impl Iterator<Item = &ScenarioResult> {
        self.results.iter().filter(|r| r.verdict == Verdict::Fail)
    }

    fn count(&self, verdict: Verdict) -> usize {
        self.results.iter().filter(|r| r.verdict == verdict).count()
    }

    /// Writes the report as `<dir>/<store>.json`.
    ///
    /// # Errors
    /// When the directory cannot be created or the file written.
    pub fn write_json(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(format!("{}.json", self.store)), json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(scenario: &str, verdict: Verdict, detail: &str) -> ScenarioResult {
        ScenarioResult {
            scenario: scenario.to_owned(),
            covers: String::new(),
            verdict,
            detail: detail.to_owned(),
            millis: 1,
        }
    }

    #[test]
    fn failure_lines_name_the_store_scenario_and_detail() {
        let report = SuiteReport {
            store: "mysql-lease".to_owned(),
            url: String::new(),
            capabilities: None,
            error: Some("no server".to_owned()),
            results: vec![
                result("exclusion/a", Verdict::Pass, ""),
                result("waiting/b", Verdict::Fail, "too slow"),
                result("process/c", Verdict::NotApplicable, "in-process"),
            ],
        };
        assert_eq!(
            report.failure_lines(),
            [
                "mysql-lease: could not be set up: no server",
                "mysql-lease/waiting/b: too slow"
            ]
        );
        assert_eq!(report.failed(), report.failure_lines().len());
    }
}
