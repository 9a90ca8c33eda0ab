//! Wrappers (layers) over any [`LockBackend`](crate::LockBackend): each is a backend itself,
//! forwards every method to the one it wraps and adds one concern, so they stack.
//!
//! - [`Counting`]: counts the calls that reach the store (how many renewals the watchdog sent,
//!   batched or not).
//!
//! A layer's `impl LockBackend` carries `#[deny(clippy::missing_trait_methods)]`, so a method
//! added to the trait later with a default cannot silently bypass it.

mod counting;

pub use counting::{Counting, Counts};
