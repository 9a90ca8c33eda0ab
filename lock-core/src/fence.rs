//! [`Fence`]: the fencing token issued with every acquisition.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A fencing token: strictly greater than every fence issued before for the same name by the
/// same store, whoever held the lock and however the holder died.
///
/// Pass it to the resource the lock protects and let the resource reject writes carrying a
/// smaller fence than one it has seen: that is what makes a lock safe against a paused holder
/// whose lease ran out. Whether a backend guarantees this strictly or on a best-effort basis is
/// declared in [`Capabilities::fencing`](crate::Capabilities::fencing).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fence(u64);

impl Fence {
    /// Wraps a raw fence value (backends use this when they read one from the store).
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fence({})", self.0)
    }
}

impl From<Fence> for u64 {
    fn from(fence: Fence) -> Self {
        fence.0
    }
}
