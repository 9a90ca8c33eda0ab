//! The fault kit: what every backend's fault-test binary needs besides its own protocol.
//!
//! - [`Instance`]: a server of `cargo xtask services`, stopped ([`Stopped`]) or paused
//!   ([`Paused`]) by a guard that undoes the fault when it drops, on every path;
//! - [`poll_until`]: wait for a condition, with a deadline instead of a fixed sleep;
//! - [`unique_name`], [`env_var`]: a fresh lock name per case, and the test environment's
//!   variables with the message that says how to set them;
//! - [`fail`], [`err`]: any error as a [`Failure`];
//! - [`Relay`]: a TCP relay between a client and its server that can watch, cut, drop or
//!   stall the traffic; a backend adds its wire format through a [`Hook`].
//!
//! The cases themselves run under [`Cases`](crate::Cases), one after another.

mod env;
mod instance;
mod names;
mod poll;
mod relay;

use std::fmt::Display;

pub use env::env_var;
pub use instance::{Instance, Paused, SERVICES_DIR_VAR, Stopped, signal};
pub use names::unique_name;
pub use poll::{poll_every, poll_until};
pub use relay::{Flow, Hook, Relay};

use crate::Failure;

/// Turns an error into a [`Failure`] that says what failed: `what: error`.
///
/// ```
/// use conformance_tests::faults::fail;
///
/// let failure = "x".parse::<u8>().map_err(fail("parsing the port")).unwrap_err();
/// assert_eq!(failure.0, "parsing the port: invalid digit found in string");
/// ```
pub fn fail<E: Display>(what: &str) -> impl FnOnce(E) -> Failure + '_ {
    move |e| Failure(format!("{what}: {e}"))
}

/// Turns an error into a [`Failure`] with the error's own text.
pub fn err(error: impl Display) -> Failure {
    Failure(error.to_string())
}
