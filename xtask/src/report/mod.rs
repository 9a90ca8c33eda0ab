//! The report of `cargo xtask compare`: everything one run measured, gathered in
//! [`Collected`] and written as `report.json` (for machines), `report.md` and `report.html`
//! (one self-contained page with its plots inline, see [`html`]), with a terminal summary no
//! wider than [`TERMINAL_WIDTH`] columns.

mod html;
pub(crate) mod markdown;
mod plots;
mod summary;
mod targets;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use comfy_table::presets;
use conformance_tests::{SuiteReport, bench};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) use summary::TERMINAL_WIDTH;

/// Cuts `line` to [`TERMINAL_WIDTH`] characters (the last three `...`).
pub(crate) fn fit(line: &str) -> String {
    if line.chars().count() <= TERMINAL_WIDTH {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(TERMINAL_WIDTH - 3).collect();
    cut.push_str("...");
    cut
}

/// What one compare run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Collected {
    /// The conformance suite's report per store (the memory reference first).
    pub(crate) suites: Vec<SuiteReport>,
    /// Each store's benchmark report.
    pub(crate) benches: Vec<bench::Report>,
    /// The migration benchmark's report per ordered pair of stores (`FROM -> TO`).
    pub(crate) pairs: Vec<bench::Report>,
    /// The migration test's verdicts per ordered pair, as it wrote them.
    pub(crate) migration: Value,
    /// The latest fault campaign's summary per store (see [`crate::chaos`]).
    pub(crate) chaos: Vec<Value>,
}

impl Collected {
    /// The benchmark report of the store labelled `store` (a suite's label).
    pub(crate) fn bench(&self, store: &str) -> Option<&bench::Report> {
        self.benches.iter().find(|b| b.store == store)
    }

    /// The fault campaign's summary of the store labelled `store` (a suite's label: the
    /// campaign names stores without their node count, and the ensemble `zk-ensemble`).
    pub(crate) fn chaos(&self, store: &str) -> Option<&Value> {
        let bare = store.split('(').next().unwrap_or(store);
        let name = if bare == "zookeeper-ensemble" {
            "zk-ensemble"
        } else {
            bare
        };
        self.chaos
            .iter()
            .find(|c| c["store"].as_str() == Some(name))
    }

    /// The report in Markdown: the scenario matrix, capabilities, performance lines, the
    /// migration's from x to matrix and the fault campaign's figures.
    pub(crate) fn markdown(&self) -> Result<String> {
        let mut markdown = format!(
            "{}\n{}\n\n{}\n\n{}\n",
            markdown::render(&self.suites),
            targets::render(&targets::all(self), presets::ASCII_MARKDOWN),
            markdown::render_benches(&self.benches, presets::ASCII_MARKDOWN),
            crate::migration_matrix::render(
                &self.migration,
                &self.pairs,
                &self.benches,
                presets::ASCII_MARKDOWN
            )?
        );
        if let Some(chaos) = crate::chaos::render(&self.chaos, presets::ASCII_MARKDOWN) {
            markdown.push_str(&format!("\n{chaos}\n"));
        }
        Ok(markdown)
    }

    /// Writes `report.json`, `report.md` and `report.html` into `out`; the HTML file's path.
    pub(crate) fn write(&self, out: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(out.join("report.json"), json)?;
        let markdown = self.markdown()?;
        std::fs::write(out.join("report.md"), &markdown)?;
        let page = html::page(self, &markdown)?;
        let path = out.join("report.html");
        std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// What the terminal shows at the end of a run: one row per store and the five-line
    /// summary, every line at most [`TERMINAL_WIDTH`] columns.
    pub(crate) fn terminal(&self) -> String {
        let (met, measured) = targets::tally(&targets::all(self));
        format!(
            "{}\n\n{}\n\n{}",
            summary::overview(self),
            summary::lines(self).join("\n"),
            fit(&format!(
                "targets: {met} of {measured} measured met (the report's Targets table)"
            ))
        )
    }
}

/// `cargo xtask report`: reads a compare run's `report.json` and writes its HTML and Markdown
/// again beside it, printing the terminal summary.
pub(crate) fn rewrite(file: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let collected: Collected =
        serde_json::from_str(&text).with_context(|| format!("reading {}", file.display()))?;
    let out = file.parent().unwrap_or_else(|| Path::new("."));
    let page = collected.write(out)?;
    println!(
        "{}\n\nThe whole report: {}",
        collected.terminal(),
        page.display()
    );
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The small recorded run in `xtask/tests/data/compare` (two stores and the memory
    /// reference, one pair, one campaign summary).
    pub(crate) fn recorded() -> Collected {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/compare");
        let text = std::fs::read_to_string(dir.join("collected.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn the_terminal_lines_fit_in_100_columns() {
        let shown = recorded().terminal();
        for line in shown.lines() {
            assert!(
                line.chars().count() <= TERMINAL_WIDTH,
                "{} columns: {line}",
                line.chars().count()
            );
        }
        assert!(shown.contains("redis"), "{shown}");
        let collected = recorded();
        let lines = summary::lines(&collected);
        assert_eq!(lines.len(), summary::LINES);
        for line in lines {
            assert!(shown.contains(&line), "{line} missing: {shown}");
        }
        assert!(shown.contains("targets: "), "{shown}");
    }

    #[test]
    fn the_rate_line_names_the_fastest_peer_and_keeps_its_numbers() {
        let mut collected = recorded();
        let peer_run = collected
            .benches
            .iter()
            .flat_map(|b| b.fleets.iter())
            .find(|r| r.peer.is_some())
            .unwrap()
            .clone();
        // Two more peers on a store with a long name, after the recorded one (rslock, 447/s):
        // a slower one and, last, the fastest, with a long name.
        let mut other = collected.benches[0].clone();
        other.store = "zookeeper-ensemble(3)".to_string();
        other.fleets = [
            ("slow-peer 0.1", 1.0),
            ("a-peer-with-a-very-long-name 0.1", 999.0),
        ]
        .into_iter()
        .map(|(name, per_second)| {
            let mut run = peer_run.clone();
            run.peer = Some(name.to_string());
            run.fleet.per_second = per_second;
            run
        })
        .collect();
        // And a faster peer run of another shape (hold 0), which the line, about 16 clients
        // holding 1 ms, does not compare with.
        let mut other_shape = peer_run.clone();
        other_shape.peer = Some("hold-zero-peer 0.1".to_string());
        other_shape.fleet.hold = std::time::Duration::ZERO;
        other_shape.fleet.per_second = 5_000.0;
        other.fleets.push(other_shape);
        collected.benches.push(other);
        let line = &summary::lines(&collected)[1];
        assert!(line.contains("; fastest peer 999/s (a-peer"), "{line}");
        assert!(
            !line.contains("slow-peer") && !line.contains("447/s") && !line.contains("5000/s"),
            "{line}"
        );
        // Long enough to be cut to the width, and cut in the peer's name, after its rate.
        assert!(
            line.ends_with("...") && line.chars().count() == TERMINAL_WIDTH,
            "{line}"
        );
    }

    #[test]
    fn long_lines_are_cut_to_the_width() {
        assert_eq!(fit("short"), "short");
        let cut = fit(&"x".repeat(300));
        assert_eq!(cut.chars().count(), TERMINAL_WIDTH);
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn the_files_are_written_and_json_reads_back() {
        let collected = recorded();
        let out = std::env::temp_dir().join(format!("xtask-report-{}", std::process::id()));
        let html = collected.write(&out).unwrap();
        let back: Collected =
            serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap())
                .unwrap();
        let page = std::fs::read_to_string(&html).unwrap();
        let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
        assert_eq!(back.suites.len(), collected.suites.len());
        assert_eq!(back.benches, collected.benches);
        assert!(markdown.contains("## Performance"), "{markdown}");
        // Self-contained: no script, style sheet or image is fetched.
        for remote in ["src=\"http", "href=\"http", "<script src", "<link"] {
            assert!(!page.contains(remote), "the page fetches `{remote}`");
        }
        assert!(page.matches("<svg").count() >= 5, "five plots at least");
    }
}
