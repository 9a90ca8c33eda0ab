//! The checker: what went wrong in a [`History`].

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::history::{History, Nanos, Section};

/// How many examples of each finding a report keeps.
const EXAMPLES: usize = 5;

/// What [`check`] found in a history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Findings {
    /// Critical sections recorded.
    pub acquisitions: u64,
    /// Writes the resource accepted.
    pub writes_accepted: u64,
    /// Writes the resource rejected (a fence below one it had accepted).
    pub writes_rejected: u64,
    /// Pairs of critical sections of one lock overlapping in time.
    pub overlaps: u64,
    /// Overlaps where the holder of the older grant (the lower fence) saw `is_held() == true`
    /// after the newer grant returned.
    pub trusted_overlaps: u64,
    /// Writes accepted after a write with a higher fence under the same lock.
    pub stale_writes: u64,
    /// Grants whose fence is not above that of a grant that returned before their acquire
    /// was called.
    pub fence_regressions: u64,
    /// Times with no holder longer than the history's `stuck_after`, outside outages.
    pub stuck_gaps: u64,
    /// The longest time with no holder outside outages, in nanoseconds.
    pub longest_gap: Nanos,
    /// Faults injected.
    pub faults: u64,
    /// Workers that panicked.
    pub panics: u64,
    /// Errors of every worker, by kind.
    pub errors: BTreeMap<String, u64>,
    /// `lost()` reasons of every worker.
    pub lost: BTreeMap<String, u64>,
    /// A few examples of each finding, described.
    pub examples: Vec<String>,
}

impl Findings {
    /// What fails the run: stale writes and fence regressions when the store declares
    /// strict fencing (`strict`), stuck gaps and panics always. Empty when the run passed.
    pub fn violations(&self, strict: bool) -> Vec<String> {
        let mut out = Vec::new();
        if strict && self.stale_writes > 0 {
            out.push(format!("{} stale writes accepted", self.stale_writes));
        }
        if strict && self.fence_regressions > 0 {
            out.push(format!(
                "{} fences went backward or repeated",
                self.fence_regressions
            ));
        }
        if self.stuck_gaps > 0 {
            out.push(format!(
                "{} stuck gaps (the longest {:.3} s)",
                self.stuck_gaps,
                self.longest_gap as f64 / 1e9
            ));
        }
        if self.panics > 0 {
            out.push(format!("{} workers panicked", self.panics));
        }
        out
    }

    fn example(&mut self, text: String) {
        if self.examples.len() < EXAMPLES * 5 {
            self.examples.push(text);
        }
    }
}

/// Judges `history` (see the crate's documentation for what each count means).
pub fn check(history: &History) -> Findings {
    let mut findings = Findings {
        acquisitions: history.sections.len() as u64,
        faults: history.faults.len() as u64,
        ..Findings::default()
    };
    let mut by_name: HashMap<&str, Vec<&Section>> = HashMap::new();
    for section in &history.sections {
        by_name.entry(&section.name).or_default().push(section);
    }
    let mut names: Vec<_> = by_name.into_iter().collect();
    names.sort_by_key(|(name, _)| *name);
    for (_, mut sections) in names {
        sections.sort_by_key(|s| (s.acquired, s.worker, s.fence));
        overlaps(&sections, &mut findings);
        regressions(&sections, &mut findings);
        gaps(history, &sections, &mut findings);
    }
    writes(history, &mut findings);
    for worker in &history.workers {
        findings.panics += u64::from(worker.panicked);
        for (kind, n) in &worker.errors {
            *findings.errors.entry(kind.clone()).or_default() += n;
        }
        for (reason, n) in &worker.lost {
            *findings.lost.entry(reason.clone()).or_default() += n;
        }
    }
    findings
}

/// Overlapping sections of one lock (sorted by `acquired`), and the trusted ones among them:
/// the holder of the older grant (the lower fence) still saw its lock held after the newer
/// grant returned.
fn overlaps(sections: &[&Section], findings: &mut Findings) {
    for (i, old) in sections.iter().enumerate() {
        for new in &sections[i + 1..] {
            if new.acquired >= old.end() {
                // Sorted by `acquired`: every later section starts after `old` ended too.
                break;
            }
            if (new.worker, new.fence) == (old.worker, old.fence) {
                continue;
            }
            findings.overlaps += 1;
            // The holder of the older grant is the one with the lower fence (fences order
            // grants; with equal fences, the order the acquires returned in): a grant can
            // return after a newer one, when the lock was lost and given on before its
            // acquire answered. Trusted: that holder still saw its lock held after the
            // newer grant returned.
            let (older, newer) = if new.fence < old.fence {
                (new, old)
            } else {
                (old, new)
            };
            let trusted = older.held_seen.is_some_and(|seen| seen > newer.acquired);
            if trusted {
                findings.trusted_overlaps += 1;
            }
            if findings.overlaps as usize <= EXAMPLES
                || (trusted && findings.trusted_overlaps as usize <= EXAMPLES)
            {
                findings.example(format!(
                    "overlap{}: `{}` worker {} fence {} until {} and worker {} fence {} from {}",
                    if trusted { " (trusted)" } else { "" },
                    old.name,
                    old.worker,
                    old.fence,
                    old.end(),
                    new.worker,
                    new.fence,
                    new.acquired
                ));
            }
        }
    }
}

/// Grants of one lock (sorted by `acquired`) whose fence is not above the highest fence of
/// the grants that had returned before their acquire was called.
fn regressions(sections: &[&Section], findings: &mut Findings) {
    // Two grants with one fence are a repeat whatever their timing (racing grants included);
    // each counts once, here or in the sweep below.
    let mut by_fence: HashMap<u64, &Section> = HashMap::new();
    let mut repeated = std::collections::HashSet::new();
    for section in sections {
        if let Some(first) = by_fence.insert(section.fence, section) {
            findings.fence_regressions += 1;
            repeated.insert(std::ptr::from_ref(*section));
            findings.example(format!(
                "fence repeated: `{}` fence {} granted to worker {} and to worker {}",
                section.name, section.fence, first.worker, section.worker
            ));
        }
    }
    let mut by_call: Vec<&Section> = sections.to_vec();
    by_call.sort_by_key(|s| s.called);
    let (mut returned, mut highest) = (0, None::<&Section>);
    for section in by_call {
        while returned < sections.len() && sections[returned].acquired < section.called {
            let candidate = sections[returned];
            if highest.is_none_or(|h| candidate.fence > h.fence) {
                highest = Some(candidate);
            }
            returned += 1;
        }
        if let Some(before) = highest
            && section.fence < before.fence
            && !repeated.contains(&std::ptr::from_ref(section))
        {
            findings.fence_regressions += 1;
            if findings.fence_regressions as usize <= EXAMPLES {
                findings.example(format!(
                    "fence regression: `{}` worker {} got fence {} (called at {}) after worker {} had fence {} (returned at {})",
                    section.name,
                    section.worker,
                    section.fence,
                    section.called,
                    before.worker,
                    before.fence,
                    before.acquired
                ));
            }
        }
    }
}

/// Times with no holder of one lock (sections sorted by `acquired`) within the run, outside
/// outages.
fn gaps(history: &History, sections: &[&Section], findings: &mut Findings) {
    let mut free_from = history.start;
    let report = |from: Nanos, to: Nanos, findings: &mut Findings| {
        let length = to
            .saturating_sub(from)
            .saturating_sub(outage_time(history, from, to));
        if length == 0 {
            return;
        }
        findings.longest_gap = findings.longest_gap.max(length);
        if length > history.stuck_after {
            findings.stuck_gaps += 1;
            if findings.stuck_gaps as usize <= EXAMPLES {
                findings.example(format!(
                    "stuck: nobody held `{}` from {from} to {to} ({:.3} s)",
                    sections.first().map_or("", |s| s.name.as_str()),
                    length as f64 / 1e9
                ));
            }
        }
    };
    for section in sections {
        if section.acquired > free_from {
            report(free_from, section.acquired, findings);
        }
        free_from = free_from.max(section.end());
    }
    if history.end > free_from {
        report(free_from, history.end, findings);
    }
}

/// How much of `from..to` outages explain: each outage from its start until `stuck_after`
/// after its end (the store back, its clients reconnecting and the lock changing hands), the
/// windows merged.
fn outage_time(history: &History, from: Nanos, to: Nanos) -> Nanos {
    let mut windows: Vec<(Nanos, Nanos)> = history
        .faults
        .iter()
        .filter(|f| f.outage)
        .map(|f| {
            (
                f.from.max(from),
                f.to.saturating_add(history.stuck_after).min(to),
            )
        })
        .filter(|(a, b)| a < b)
        .collect();
    windows.sort_unstable();
    let (mut covered, mut reach) = (0, from);
    for (a, b) in windows {
        let a = a.max(reach);
        if b > a {
            covered += b - a;
            reach = b;
        }
    }
    covered
}

/// Accepted writes below a fence the resource had accepted before under the same lock.
fn writes(history: &History, findings: &mut Findings) {
    let mut order: Vec<_> = history.writes.iter().collect();
    order.sort_by_key(|w| w.seq);
    let mut highest: HashMap<&str, u64> = HashMap::new();
    for write in order {
        if !write.accepted {
            findings.writes_rejected += 1;
            continue;
        }
        findings.writes_accepted += 1;
        let top = highest.entry(&write.name).or_insert(write.fence);
        if write.fence < *top {
            findings.stale_writes += 1;
            if findings.stale_writes as usize <= EXAMPLES {
                findings.example(format!(
                    "stale write: `{}` fence {} by worker {} accepted after fence {}",
                    write.name, write.fence, write.worker, top
                ));
            }
        } else {
            *top = write.fence;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fault, Resource, WorkerEnd};

    const MS: Nanos = 1_000_000;

    /// Three holders of `a` taking turns, each writing once: nothing wrong.
    fn clean() -> History {
        let resource = Resource::new(true);
        let mut history = History::new(0, 40 * MS, 20 * MS);
        for (i, worker) in [1, 2, 3].into_iter().enumerate() {
            let at = i as Nanos * 10 * MS;
            let fence = i as u64 + 1;
            history.sections.push(Section::released(
                "a",
                worker,
                fence,
                at,
                at + MS,
                at + 9 * MS,
            ));
            resource.write("a", fence, worker, at + 5 * MS);
        }
        history.writes = resource.log();
        history
    }

    #[test]
    fn a_clean_history_passes() {
        let findings = check(&clean());
        assert_eq!(findings.acquisitions, 3);
        assert_eq!(findings.writes_accepted, 3);
        assert_eq!(findings.overlaps, 0);
        assert_eq!(findings.fence_regressions, 0);
        assert_eq!(findings.stale_writes, 0);
        assert_eq!(findings.stuck_gaps, 0);
        assert!(findings.violations(true).is_empty(), "{findings:?}");
    }

    #[test]
    fn an_overlap_is_found_and_trusted_when_the_old_holder_still_saw_it_held() {
        let mut history = clean();
        // Worker 1 comes back from a pause and still writes after worker 2's grant (11 ms),
        // having seen its lock held at 12 ms: a trusted overlap.
        history.sections[0].ended = Some(13 * MS);
        history.sections[0].held_seen = Some(12 * MS);
        let findings = check(&history);
        assert_eq!((findings.overlaps, findings.trusted_overlaps), (1, 1));
        // Seen held last before the newer grant: an overlap, not a trusted one.
        history.sections[0].held_seen = Some(10 * MS);
        let findings = check(&history);
        assert_eq!((findings.overlaps, findings.trusted_overlaps), (1, 0));
        // Overlaps alone fail no run: the fence is there for them.
        assert!(findings.violations(true).is_empty());
    }

    #[test]
    fn a_grant_returned_after_a_newer_one_is_not_the_older_holder() {
        // Found by a 600 s row-lock campaign (seed 2027): worker 61 was granted fence 3887,
        // its connection was killed before its acquire returned, the server gave the lock
        // to worker 62 (fence 3888), whose acquire returned first. Worker 61's returned 4 ms
        // later with its lock already lost: it never saw it held and ended 66 us later.
        // Worker 62 holding on is no trust misplaced: it holds the newer grant.
        let mut history = History::new(0, 200 * MS, 100 * MS);
        let mut newer = Section::released("a", 62, 3888, 0, 4 * MS, 47 * MS);
        newer.held_seen = Some(46 * MS);
        let mut stale = Section::released("a", 61, 3887, 0, 8 * MS, 8 * MS + 66_000);
        stale.held_seen = None;
        history.sections = vec![newer.clone(), stale.clone()];
        let findings = check(&history);
        assert_eq!((findings.overlaps, findings.trusted_overlaps), (1, 0));
        // Had worker 61 seen its (older) lock held after worker 62's grant, that is trusted.
        stale.held_seen = Some(8 * MS);
        stale.ended = Some(9 * MS);
        history.sections = vec![newer, stale];
        assert_eq!(check(&history).trusted_overlaps, 1);
    }

    #[test]
    fn a_worker_that_died_holding_counts_until_its_ttl() {
        let mut history = clean();
        history.sections[0].ended = None;
        history.sections[0].ttl = 20 * MS;
        assert_eq!(check(&history).overlaps, 1);
    }

    #[test]
    fn a_stale_write_is_found_only_where_the_resource_accepted_it() {
        let mut history = clean();
        let unchecked = Resource::new(false);
        for (fence, worker) in [(2, 2), (1, 1), (3, 3)] {
            unchecked.write("a", fence, worker, 0);
        }
        history.writes = unchecked.log();
        let findings = check(&history);
        assert_eq!(findings.stale_writes, 1);
        assert_eq!(findings.violations(true).len(), 1);
        assert!(
            findings.violations(false).is_empty(),
            "not strict: reported only"
        );

        let checked = Resource::new(true);
        for (fence, worker) in [(2, 2), (1, 1), (3, 3)] {
            checked.write("a", fence, worker, 0);
        }
        history.writes = checked.log();
        let findings = check(&history);
        assert_eq!((findings.stale_writes, findings.writes_rejected), (0, 1));
    }

    #[test]
    fn a_fence_that_repeats_or_goes_back_is_a_regression() {
        let mut history = clean();
        history.sections[2].fence = 2;
        assert_eq!(check(&history).fence_regressions, 1);
        history.sections[2].fence = 1;
        let findings = check(&history);
        assert_eq!(findings.fence_regressions, 1);
        assert_eq!(findings.violations(true).len(), 1);
    }

    /// Worker 1 granted fence 5 (called at 0, returned at 2 ms); worker 2's acquire, called
    /// at 1 ms before that answer, granted `fence`.
    fn racing(fence: u64) -> History {
        let mut history = History::new(0, 10 * MS, 20 * MS);
        history
            .sections
            .push(Section::released("a", 1, 5, 0, 2 * MS, 3 * MS));
        history
            .sections
            .push(Section::released("a", 2, fence, MS, 4 * MS, 5 * MS));
        history
    }

    #[test]
    fn grants_racing_each_other_are_not_ordered_by_their_answers() {
        // A lower fence may be the earlier grant whose answer came late.
        assert_eq!(check(&racing(4)).fence_regressions, 0);
    }

    #[test]
    fn a_stuck_gap_is_found_unless_an_outage_explains_it() {
        let mut history = clean();
        history.end = 100 * MS;
        let findings = check(&history);
        assert_eq!(findings.stuck_gaps, 1, "{findings:?}");
        assert_eq!(findings.longest_gap, 71 * MS);
        assert_eq!(findings.violations(false).len(), 1);
        history.faults.push(Fault {
            what: "store restart".into(),
            from: 40 * MS,
            to: 80 * MS,
            outage: true,
        });
        assert_eq!(check(&history).stuck_gaps, 0);
        history.faults[0].outage = false;
        assert_eq!(
            check(&history).stuck_gaps,
            1,
            "a worker's pause explains nothing"
        );
    }

    #[test]
    fn an_outage_explains_only_its_own_time() {
        let mut history = clean();
        history.end = 200 * MS;
        // Down from 40 to 50 ms; with 20 ms to recover, 40..70 is explained, 29..40 and
        // 70..200 (141 ms) are not.
        history.faults.push(Fault {
            what: "store restart".into(),
            from: 40 * MS,
            to: 50 * MS,
            outage: true,
        });
        let findings = check(&history);
        assert_eq!(findings.stuck_gaps, 1, "{findings:?}");
        assert_eq!(findings.longest_gap, 141 * MS);
    }

    #[test]
    fn one_fence_granted_twice_is_a_regression_even_when_racing() {
        assert_eq!(check(&racing(5)).fence_regressions, 1);
    }

    #[test]
    fn panics_errors_and_losses_are_counted() {
        let mut history = clean();
        for (worker, panicked) in [(1, false), (2, true)] {
            history.workers.push(WorkerEnd {
                worker,
                panicked,
                errors: [("unavailable".to_owned(), 2)].into(),
                lost: [("expired".to_owned(), 1)].into(),
            });
        }
        let findings = check(&history);
        assert_eq!(findings.panics, 1);
        assert_eq!(findings.errors["unavailable"], 4);
        assert_eq!(findings.lost["expired"], 2);
        assert_eq!(findings.violations(false), ["1 workers panicked"]);
    }

    #[test]
    fn a_history_survives_json() {
        let history = clean();
        let text = serde_json::to_string(&history).unwrap();
        let back: History = serde_json::from_str(&text).unwrap();
        assert_eq!(back, history);
    }
}
