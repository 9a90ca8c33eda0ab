//! Wrappers (layers) over any [`LockBackend`](crate::LockBackend): each is a backend itself,
//! forwards every method to the one it wraps and adds one concern, so they stack.
//!
//! - [`Counting`]: counts the calls that reach the store (how many renewals the watchdog sent,
//!   batched or not).
//! - `Metrics` (feature `metrics`): reports acquire and hold times, contention, losses,
//!   renewals and gauges of held and waiting locks through the `metrics` facade crate.
//!
//! A layer's `impl LockBackend` carries `#[deny(clippy::missing_trait_methods)]`, so a method
//! added to the trait later with a default cannot silently bypass it.

mod counting;
#[cfg(feature = "metrics")]
mod metrics;

pub use counting::{Counting, Counts};
#[cfg(feature = "metrics")]
pub use metrics::Metrics;
