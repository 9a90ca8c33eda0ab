//! What the store's own servers count around a fleet run: the operations they served, so a run
//! reports what each acquisition cost the store, and the sessions (connections) open, so it
//! reports how many each client kept.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use super::{Fleet, SecondHalf};

/// A store's server-side counters, summed over its servers. Each benchmark implements it with
/// the store's own statistics (Redis `INFO`, MySQL `SHOW GLOBAL STATUS`, ZooKeeper `mntr`).
pub trait ServerCounters: Send + Sync {
    /// What one operation is for this store, for the report ("commands", "statements").
    fn operations_are(&self) -> &'static str;

    /// Operations served so far.
    fn operations(&self) -> impl Future<Output = Result<u64, String>> + Send;

    /// Client sessions (connections) open now.
    fn sessions(&self) -> impl Future<Output = Result<u64, String>> + Send;
}

/// How often sessions are sampled during a run (the largest sample counts). The samples are
/// a few operations per second, left in the count.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Runs `run` (a blocking fleet run of `clients` clients) on a blocking thread and fills in
/// the fleet's [`Fleet::operations_per_acquisition`] and [`Fleet::sessions_per_client`]:
///
/// - operations: those the servers counted in the second half of the run, up to the end of
///   its turns (see [`SecondHalf`]; the whole run for a fleet that does not say), per
///   acquisition, both between the last samples at or before its middle and its end; not
///   counted when the samples do not cover the half. The first half has every client's first
///   tries and subscriptions, which with a thousand clients outweigh the hand-offs of a short
///   run, and so does the clean-up of every client still waiting at the end (see the
///   CHANGELOG);
/// - sessions: the most open during the run, above those open before it, per client.
///
/// Both counters are read every 100 ms; the reads are a few operations per second,
/// left in the count. It returns once the servers have closed the run's sessions (see
/// `drained`).
///
/// # Errors
/// The run's error, or a counter that could not be read.
pub async fn counted<S, R>(counters: &S, clients: usize, run: R) -> Result<Fleet, String>
where
    S: ServerCounters,
    R: FnOnce() -> Result<Fleet, String> + Send + 'static,
{
    let sessions_before = counters.sessions().await?;
    let operations_before = counters.operations().await?;
    let mut samples = vec![(Instant::now(), operations_before)];
    let mut most = sessions_before;
    let mut running = tokio::task::spawn_blocking(run);
    let fleet = loop {
        tokio::select! {
            joined = &mut running => {
                break joined.map_err(|e| format!("a fleet run panicked: {e}")).and_then(|r| r);
            }
            () = tokio::time::sleep(SAMPLE_EVERY) => {
                if let Ok(now) = counters.sessions().await {
                    most = most.max(now);
                }
                if let Ok(operations) = counters.operations().await {
                    samples.push((Instant::now(), operations));
                }
            }
        }
    };
    let mut fleet = match fleet {
        Ok(fleet) => fleet,
        Err(error) => {
            // A failed run's sessions close too before the next run starts.
            drained(counters, sessions_before).await;
            return Err(error);
        }
    };
    let operations_after = counters.operations().await?;
    // Not counted (None) when the samples do not cover the steady half (reads failed), or
    // without an acquisition in it: operations per nothing.
    let counted = match &fleet.second_half {
        Some(half) => steady(&samples, half),
        None => Some((
            operations_after.saturating_sub(operations_before),
            fleet.acquisitions,
        )),
    };
    fleet.operations_per_acquisition = counted
        .filter(|(_, acquisitions)| *acquisitions > 0)
        .map(|(operations, acquisitions)| operations as f64 / acquisitions as f64);
    fleet.sessions_per_client =
        Some(most.saturating_sub(sessions_before) as f64 / clients.max(1) as f64);
    drained(counters, sessions_before).await;
    Ok(fleet)
}

/// The operations counted between the last sample at or before the middle of `half` and the
/// last sample at or before its end, and the acquisitions between those two samples (one
/// window for both); `None` when those samples do not cover most of the half (counter reads
/// failed): the first must be at most a quarter of the half before its middle, and the two
/// at least half of the half apart.
fn steady(samples: &[(Instant, u64)], half: &SecondHalf) -> Option<(u64, usize)> {
    let last_by = |instant: Instant| samples.iter().rev().find(|(at, _)| *at <= instant);
    let (from, from_ops) = *last_by(half.middle)?;
    let (to, to_ops) = *last_by(half.end)?;
    let length = half.end.saturating_duration_since(half.middle);
    if half.middle.saturating_duration_since(from) > length / 4
        || to.saturating_duration_since(from) < length / 2
    {
        return None;
    }
    let acquisitions = half
        .acquired
        .iter()
        .filter(|at| (from..to).contains(*at))
        .count();
    Some((to_ops.saturating_sub(from_ops), acquisitions))
}

/// How long the servers get to close a run's sessions before the next run starts anyway.
const DRAIN_AT_MOST: Duration = Duration::from_secs(30);

/// Sessions above the count before a run that still count as drained: the benchmark's own
/// pools may have opened one or two meanwhile (the counters' reads among them).
const DRAIN_SLACK: u64 = 2;

/// Waits until the servers count at most [`DRAIN_SLACK`] sessions more than `before` (the
/// run's clients are gone, so the next run does not measure the server closing a thousand of
/// them), reading the count every 100 ms, for at most [`DRAIN_AT_MOST`].
async fn drained<S: ServerCounters>(counters: &S, before: u64) {
    let until = Instant::now() + DRAIN_AT_MOST;
    while Instant::now() < until {
        match counters.sessions().await {
            Ok(now) if now > before + DRAIN_SLACK => tokio::time::sleep(SAMPLE_EVERY).await,
            _ => return,
        }
    }
}

/// The integer after `key` and one separator (`:` in Redis `INFO`, a tab in ZooKeeper `mntr`)
/// on a line of `text`.
pub fn stat_line(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?;
        let value = rest.strip_prefix(':').or_else(|| rest.strip_prefix('\t'))?;
        value.trim().parse().ok()
    })
}

/// The sum of the integers on the lines of `text` whose key (before `:` or a tab) starts with
/// `prefix` and ends with `suffix`: ZooKeeper's `mntr` counts reads per namespace (the first
/// part of a path), one line each (`zk_cnt_<namespace>_read_per_namespace`). Lines whose value
/// is not an integer are left out.
pub fn stat_sum(text: &str, prefix: &str, suffix: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.split_once('\t').or_else(|| line.split_once(':')))
        .filter(|(key, _)| key.len() >= prefix.len() + suffix.len())
        .filter(|(key, _)| key.starts_with(prefix) && key.ends_with(suffix))
        .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_half_ends_where_the_turns_end() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // 10 operations every 100 ms until 2 s, then the clean-up: 1,000 more.
        let mut samples: Vec<_> = (0..=20).map(|i| (at(i * 100), i * 10)).collect();
        samples.push((at(2_100), 1_200));
        let half = SecondHalf {
            middle: at(1_090),
            end: at(2_090),
            // One acquisition every 50 ms from 25 ms on, until the end.
            acquired: (0..41).map(|i| at(25 + i * 50)).collect(),
        };
        // From the sample at 1 s to the one at 2 s: 100 operations, and the 20 acquisitions
        // between those samples (19 between the middle and the end).
        assert_eq!(steady(&samples, &half), Some((100, 20)));
        let within = |from: u64, to: u64| -> Vec<(Instant, u64)> {
            samples
                .iter()
                .copied()
                .filter(|(t, _)| (at(from)..=at(to)).contains(t))
                .collect()
        };
        // Reads that failed after 1.5 s: from the sample at 1 s to the one at 1.5 s.
        assert_eq!(steady(&within(0, 1_500), &half), Some((50, 10)));
        // Samples that do not cover the half: not counted.
        assert_eq!(steady(&samples[..1], &half), None);
        assert_eq!(steady(&within(1_800, 2_100), &half), None);
        assert_eq!(steady(&within(0, 1_300), &half), None);
    }

    #[test]
    fn stat_lines_are_found_by_their_whole_key() {
        let info = "total_commands_processed:42\r\nconnected_clients:7\r\n";
        assert_eq!(stat_line(info, "connected_clients"), Some(7));
        assert_eq!(stat_line(info, "total_commands_processed"), Some(42));
        assert_eq!(stat_line(info, "total_commands"), None);
        let mntr = "zk_packets_received\t26\nzk_num_alive_connections\t1\n";
        assert_eq!(stat_line(mntr, "zk_packets_received"), Some(26));
        assert_eq!(stat_line(mntr, "zk_num_alive"), None);
    }

    #[test]
    fn stat_sums_add_the_lines_of_one_family() {
        let mntr = "zk_cnt_locks_read_per_namespace\t2169\n\
                    zk_cnt_bench_read_per_namespace\t31\n\
                    zk_sum_locks_read_per_namespace\t99999\n\
                    zk_cnt_locks_write_per_namespace\t57211\n\
                    zk_avg_locks_read_per_namespace\t1.5\n\
                    zk_cnt__read_per_namespace\t7\n\
                    zk_cnt_odd_read_per_namespace\t12.5\n";
        let reads = stat_sum(mntr, "zk_cnt_", "_read_per_namespace");
        assert_eq!(
            reads,
            2169 + 31 + 7,
            "a value that is not an integer is left out"
        );
        assert_eq!(stat_sum(mntr, "zk_cnt_", "_delete_per_namespace"), 0);
        // The prefix and the suffix may not overlap.
        assert_eq!(stat_sum("ab\t5\n", "ab", "b"), 0);
    }
}
