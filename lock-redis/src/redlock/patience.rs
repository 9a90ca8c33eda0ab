//! [`Patience`]: how long a Redlock client waits for each server's answer, adapted to how
//! fast a majority of its servers answers.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// What one server did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    /// It answered (a reply, or what it holds is not this library's) after this long.
    In(Duration),
    /// It failed at once (a refused connection, an error): waiting longer would not help.
    Failed,
    /// It had not answered when the wait ended.
    Late,
}

/// How long a Redlock client waits for each server's answer to a vote and to the other
/// requests it sends to every server (a renewal, a release, a place kept, an inspection): the
/// configured per-server time-out ([`crate::RedlockConfig::node_timeout`]) while a majority
/// answers well within it, longer while it does not.
///
/// Each vote, and each other single request sent to every server, teaches it (from the wait
/// that request used; the undo of a failed vote, a batch of renewals and `list`'s scans do not):
/// - when a majority answered (a reply, not an error), the wait becomes twice the time that
///   majority took (the answer of the slowest server of the fastest majority), but never
///   below the time-out;
/// - when too few answered for a majority and some had not answered when the wait ended, it
///   becomes twice the wait that request used, but never less than it was (a try that waited
///   only the time-out does not undo what longer waits learned);
/// - when too few answered and none was late (servers that refuse at once), it goes back to
///   the time-out: waiting longer would not help.
///
/// It never goes above [`crate::RedlockConfig::longest_wait`], four times the time-out. So
/// while a majority answers within half the time-out, a server that does not answer costs each
/// request the time-out, as with a fixed one; a majority that answers late (links slower than
/// the time-out, a client host so busy that answers reach its threads late) is waited for
/// rather than counted as failed on every vote, where each failed vote is also undone on the
/// servers that may hold it. The cost: while a majority does not answer at all (a partition,
/// servers paused), each renewal, release or place kept waits up to four times the time-out,
/// and each vote as long, but not past the caller's wait budget when that is longer than the
/// time-out (a try without a wait waits the time-out, as before).
///
/// Shared by every task of one client; concurrent requests each store what they learned, the
/// last one wins.
#[derive(Debug)]
pub(super) struct Patience {
    floor: Duration,
    cap: Duration,
    micros: AtomicU64,
}

impl Patience {
    /// Patience that starts at, and never goes below, `timeout`, nor above `cap`.
    pub(super) fn new(timeout: Duration, cap: Duration) -> Self {
        Self {
            floor: timeout,
            cap: cap.max(timeout),
            micros: AtomicU64::new(micros(timeout)),
        }
    }

    /// How long to wait for each server now.
    pub(super) fn get(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }

    /// The configured per-server time-out: the shortest wait.
    pub(super) fn floor(&self) -> Duration {
        self.floor
    }

    /// Learns from the answers of every server to one request that waited `used` for each,
    /// `quorum` of which make a majority.
    pub(super) fn observe(&self, used: Duration, answers: &[Answered], quorum: usize) {
        let next = next((used, self.get()), (self.floor, self.cap), answers, quorum);
        self.micros.store(micros(next), Ordering::Relaxed);
    }
}

/// The patience, between `floor` and `cap`, after a request that waited `used` for each
/// server (while the patience was `current`) and heard `answers`.
fn next(
    (used, current): (Duration, Duration),
    (floor, cap): (Duration, Duration),
    answers: &[Answered],
    quorum: usize,
) -> Duration {
    let mut times: Vec<Duration> = answers
        .iter()
        .filter_map(|answer| match answer {
            Answered::In(took) => Some(*took),
            Answered::Failed | Answered::Late => None,
        })
        .collect();
    times.sort_unstable();
    if let Some(majority) = quorum.checked_sub(1).and_then(|i| times.get(i)) {
        return majority.saturating_mul(2).clamp(floor, cap);
    }
    if answers.contains(&Answered::Late) {
        used.saturating_mul(2).max(current).clamp(floor, cap)
    } else {
        floor
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const FLOOR: Duration = Duration::from_millis(50);
    const BOUNDS: (Duration, Duration) = (FLOOR, Duration::from_millis(200));
    const L: Answered = Answered::Late;
    const F: Answered = Answered::Failed;

    fn after(ms: u32) -> Answered {
        Answered::In(MS * ms)
    }

    #[test]
    fn a_late_majority_doubles_the_wait_up_to_the_cap() {
        let late = [after(1), after(2), L, L, L];
        assert_eq!(next((FLOOR, FLOOR), BOUNDS, &late, 3), 2 * FLOOR);
        assert_eq!(next((2 * FLOOR, 2 * FLOOR), BOUNDS, &late, 3), 4 * FLOOR);
        assert_eq!(next((4 * FLOOR, 4 * FLOOR), BOUNDS, &late, 3), 4 * FLOOR);
    }

    #[test]
    fn a_majority_that_answered_sets_twice_its_time_within_the_bounds() {
        // One server silent: the majority answered in 2 ms, so the wait is the time-out again.
        let one_silent = [after(1), after(2), after(2), after(3), L];
        assert_eq!(next((4 * FLOOR, 4 * FLOOR), BOUNDS, &one_silent, 3), FLOOR);
        // A majority that took 60 ms: 120 ms.
        let slow = [after(1), after(2), after(60), after(61), after(62)];
        assert_eq!(next((2 * FLOOR, 2 * FLOOR), BOUNDS, &slow, 3), 120 * MS);
        // One that took 190 ms: the cap.
        let slower = [after(190), after(190), after(190), L, L];
        assert_eq!(next((4 * FLOOR, 4 * FLOOR), BOUNDS, &slower, 3), 4 * FLOOR);
    }

    #[test]
    fn errors_are_no_answers_and_only_lateness_doubles() {
        // Two servers refuse, two are late: the only possible majority needs a late one.
        let refused_and_late = [F, F, after(1), L, L];
        assert_eq!(
            next((FLOOR, FLOOR), BOUNDS, &refused_and_late, 3),
            2 * FLOOR
        );
        // Three refuse at once and nobody is late: no longer wait helps.
        let refused = [F, F, F, after(1), after(1)];
        assert_eq!(next((4 * FLOOR, 4 * FLOOR), BOUNDS, &refused, 3), FLOOR);
    }

    #[test]
    fn patience_learns_from_the_wait_a_request_used() {
        let patience = Patience::new(FLOOR, BOUNDS.1);
        assert_eq!(patience.get(), FLOOR);
        // Two requests that both waited 50 ms and were late: 100 ms, not 200 ms.
        patience.observe(FLOOR, &[L, L, L, after(1), after(1)], 3);
        patience.observe(FLOOR, &[L, L, L, after(1), after(1)], 3);
        assert_eq!(patience.get(), 2 * FLOOR);
        patience.observe(2 * FLOOR, &[after(1), after(1), after(1), L, L], 3);
        assert_eq!(patience.get(), FLOOR);
        assert_eq!(patience.floor(), FLOOR);
    }

    #[test]
    fn a_short_wait_that_was_late_does_not_lower_the_patience() {
        let patience = Patience::new(FLOOR, BOUNDS.1);
        patience.observe(2 * FLOOR, &[L, L, L, after(1), after(1)], 3);
        assert_eq!(patience.get(), 4 * FLOOR);
        // A try without a wait budget waits the time-out: its lateness says nothing new.
        patience.observe(FLOOR, &[L, L, L, after(1), after(1)], 3);
        assert_eq!(patience.get(), 4 * FLOOR);
    }
}
