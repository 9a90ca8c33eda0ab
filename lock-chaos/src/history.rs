//! What a campaign records: critical sections, the resource's writes, faults, and how each
//! worker ended.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Nanoseconds of the machine's monotonic clock (`CLOCK_MONOTONIC`): comparable between the
/// processes of one machine, never stepped by the wall clock.
pub type Nanos = u64;

/// One critical section: a grant of `name` to `worker` with `fence`, from the acquire call
/// to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    /// The lock's name.
    pub name: String,
    /// The worker (one process) that held it.
    pub worker: u32,
    /// The fence the grant carried.
    pub fence: u64,
    /// When `acquire` was called.
    pub called: Nanos,
    /// When `acquire` returned the grant.
    pub acquired: Nanos,
    /// The last time the holder saw `is_held() == true` (`None`: it never looked).
    pub held_seen: Option<Nanos>,
    /// When the section ended on the worker's side: `release` called, or `lost()` resolved.
    /// `None` when the worker died holding it; then the section counts until `acquired`
    /// plus the lease's TTL.
    pub ended: Option<Nanos>,
    /// The lease's TTL.
    pub ttl: Nanos,
}

impl Section {
    /// A section released at `ended`, seen held just before (a convenience for tests and
    /// examples; the TTL is one second).
    pub fn released(
        name: &str,
        worker: u32,
        fence: u64,
        called: Nanos,
        acquired: Nanos,
        ended: Nanos,
    ) -> Self {
        Self {
            name: name.to_owned(),
            worker,
            fence,
            called,
            acquired,
            held_seen: Some(ended),
            ended: Some(ended),
            ttl: 1_000_000_000,
        }
    }

    /// When the section ends for the checker: its end, or its lease's expiry when the
    /// worker died holding it.
    pub fn end(&self) -> Nanos {
        self.ended
            .unwrap_or_else(|| self.acquired.saturating_add(self.ttl))
    }
}

/// One write the fenced resource received, in its own order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Write {
    /// The resource's sequence number of the write (its own order).
    pub seq: u64,
    /// The lock that protects what was written.
    pub name: String,
    /// The fence the writer presented.
    pub fence: u64,
    /// The writer.
    pub worker: u32,
    /// When the resource received it.
    pub at: Nanos,
    /// Whether the resource accepted it.
    pub accepted: bool,
}

/// A fault the campaign injected, from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// What it was (`"sigstop worker 3"`, `"redis restart"`, ...).
    pub what: String,
    /// When it began.
    pub from: Nanos,
    /// When it ended (the store or the worker was back).
    pub to: Nanos,
    /// Whether the store could not serve anyone meanwhile (a crash, a cut link to every
    /// worker): a gap with no holder inside it is explained.
    pub outage: bool,
}

/// How one worker ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerEnd {
    /// The worker.
    pub worker: u32,
    /// Whether it panicked.
    pub panicked: bool,
    /// Failed acquires and releases by the error's kind.
    pub errors: BTreeMap<String, u64>,
    /// Holds that ended by `lost()`, by reason.
    pub lost: BTreeMap<String, u64>,
}

/// Everything a campaign on one store recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// When the workers started contending.
    pub start: Nanos,
    /// When they stopped.
    pub end: Nanos,
    /// A time with no holder longer than this, not explained by an outage, is a stuck gap:
    /// the TTL plus the wait budget.
    pub stuck_after: Nanos,
    /// The critical sections of every worker.
    pub sections: Vec<Section>,
    /// The resource's writes, in its order.
    pub writes: Vec<Write>,
    /// The faults injected.
    pub faults: Vec<Fault>,
    /// How each worker ended (a worker killed by the campaign and restarted counts once per
    /// process).
    pub workers: Vec<WorkerEnd>,
}

impl History {
    /// An empty history of a run from `start` to `end`, where no holder for longer than
    /// `stuck_after` is a stuck gap.
    pub fn new(start: Nanos, end: Nanos, stuck_after: Nanos) -> Self {
        Self {
            start,
            end,
            stuck_after,
            ..Self::default()
        }
    }
}

/// One line a worker writes (JSON, one per line, flushed at once, so a worker killed
/// mid-run leaves every record it made before).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    /// A grant, written as soon as `acquire` returned (`held_seen` and `ended` are `None`).
    Grant(Section),
    /// The end of the section of `worker`'s grant of `name` with `fence`.
    End {
        /// The worker.
        worker: u32,
        /// The lock.
        name: String,
        /// The grant's fence.
        fence: u64,
        /// The last time the holder saw `is_held() == true`.
        held_seen: Option<Nanos>,
        /// When the section ended.
        ended: Nanos,
    },
    /// How the worker ended (not written by a worker that was killed or panicked).
    Done(WorkerEnd),
}

impl History {
    /// Adds `records` (of any workers, in any order): grants become sections, completed by
    /// their ends; a grant without an end is a worker that died holding.
    pub fn add(&mut self, records: impl IntoIterator<Item = Record>) {
        let mut ends = std::collections::HashMap::new();
        let mut grants = Vec::new();
        for record in records {
            match record {
                Record::Grant(section) => grants.push(section),
                Record::End {
                    worker,
                    name,
                    fence,
                    held_seen,
                    ended,
                } => {
                    ends.insert((worker, name, fence), (held_seen, ended));
                }
                Record::Done(end) => self.workers.push(end),
            }
        }
        for mut section in grants {
            let key = (section.worker, section.name.clone(), section.fence);
            if let Some((held_seen, ended)) = ends.remove(&key) {
                section.held_seen = held_seen;
                section.ended = Some(ended);
            }
            self.sections.push(section);
        }
    }
}
