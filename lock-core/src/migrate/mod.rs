//! Moving a fleet's locks from one store to another without a window of double grants, with
//! fences that never go back ([`MigratingBackend`]).
//!
//! **Phases.** Every client runs in one phase; a rolling deploy moves the fleet one step at a
//! time, and two phases that are not next to each other never run together:
//!
//! | phase | locks in | fences |
//! | --- | --- | --- |
//! | [`Phase::Old`] | `from` | generation `g` over `from`'s fences |
//! | [`Phase::Dual`] | `from`, then `to` (both held; lost when either is) | `g` over `from`'s while the record's authority is `from`; `g + 1` over `to`'s after the flip |
//! | [`Phase::New`] | `to` | `g + 1` over `to`'s; refuses to start before the flip |
//!
//! `old` and `dual` clients exclude each other through `from`, `dual` and `new` through `to`.
//!
//! **Fences** are `generation << 53 | store fence` ([`fence::encode`]): after the flip every
//! fence is above every fence issued before it, whichever the two stores and however their
//! own counters compare (ZooKeeper's zxids included). Generation 0 is the identity. A store
//! fence at or above 2^53 is a typed error. (53 bits, not the 48 the design review proposed:
//! this project's Redis fences are microsecond hybrid clocks, about 1.8 * 10^15 today, above
//! 2^48 = 2.8 * 10^14; every store's fences here stay below 2^53.)
//!
//! **The record** ([`MigrationRecord`]) says where authority is; it only moves forward and
//! must live where reads are linearizable. A dual holder reads it after holding both locks,
//! so holders (serialized by the lock) see it in order; an `old` client reads it after taking
//! `from` and gives the lock back once authority has moved. A backend refuses a record that
//! reads older than one it has seen.
//!
//! **After the migration** clients stay in [`Phase::New`] with the same record: a plain
//! client of the target would issue fences below those of generation 1 and up (which are at
//! least 2^53, beyond what a double holds exactly).
//!
//! **A dual hold ends** when either side ends: a renewal that finds a side lost gives the
//! other back at once, and a side's end signal (a session store) ends the whole hold, the
//! other side given back by a task that watches it.

pub mod fence;
mod migrating;
mod record;

pub use migrating::{MigratingBackend, Phase};
pub use record::{Authority, MemoryRecord, MigrationRecord, Record};
