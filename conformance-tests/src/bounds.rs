//! Compile-time bounds checks for a backend's unit tests: each call compiles only when its
//! type or future has the bound, so a backend that stops being shareable across tasks fails
//! to build its tests.

use std::future::Future;

/// Compiles when `T` can be shared across tasks and threads for the life of a program.
pub fn send_sync_static<T: Send + Sync + 'static>() {}

/// Compiles when the future can move to another task (it is not awaited).
pub fn send<F: Future + Send>(_: &F) {}
