//! The fault campaign's record and its judge.
//!
//! A campaign runs worker processes that contend for locks while faults are injected. Each
//! worker records its critical sections ([`Section`]); a fenced resource ([`Resource`])
//! keeps the highest fence seen per lock and records every write in its own order
//! ([`Write`]); the runner records its faults ([`Fault`]). [`check`] reads the whole
//! [`History`] and counts what went wrong ([`Findings`]):
//!
//! - **overlaps**: two critical sections of one lock overlapping in time, and among them the
//!   **trusted** ones, where the holder of the older grant (the lower fence: a grant can
//!   return after a newer one when its lock was lost and given on before it answered) still
//!   saw `is_held() == true` after the newer grant returned;
//! - **stale writes**: a write the resource accepted although a higher fence had already
//!   been accepted (a fence that failed to protect);
//! - **fence regressions**: a grant whose fence is not above that of a grant that had
//!   returned before its acquire was called;
//! - **stuck gaps**: no holder for longer than the TTL plus the wait budget, not explained
//!   by a store outage;
//! - panics, errors by kind and `lost()` reasons, as the workers counted them.
//!
//! [`Findings::violations`] says which counts fail a run: stale writes and fence regressions
//! on a store that declares strict fencing; stuck gaps and panics on every store.
//!
//! ```
//! use lock_chaos::{History, Resource, Section, check};
//!
//! let resource = Resource::new(true);
//! let mut history = History::new(0, 6_000_000, 5_000_000);
//! for (worker, fence, at) in [(1, 1, 0), (2, 2, 2_000_000), (1, 3, 4_000_000)] {
//!     history.sections.push(Section::released("a", worker, fence, at, at + 100, at + 1_000_000));
//!     resource.write("a", fence, worker, at + 500);
//! }
//! history.writes = resource.log();
//! let findings = check(&history);
//! assert_eq!(findings.overlaps, 0);
//! assert!(findings.violations(true).is_empty(), "{:?}", findings.violations(true));
//! ```

pub mod campaign;
mod check;
pub mod clock;
mod history;
pub mod links;
mod resource;
pub mod server;
pub mod store_faults;
pub mod stores;
pub mod worker;

pub use check::{Findings, check};
pub use history::{Fault, History, Nanos, Record, Section, WorkerEnd, Write};
pub use resource::Resource;
