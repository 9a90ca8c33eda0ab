//! [`AcquireRequest`]: one validated request to acquire a lock, as a backend is handed it.

use std::time::{Duration, Instant};

use crate::{Backoff, LockError, LockName, LockOptions};

/// A validated request to acquire one lock.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    name: LockName,
    ttl: Duration,
    wait: Duration,
    backoff: Backoff,
    started: Instant,
}

impl AcquireRequest {
    /// A request for `name` with the TTL, wait budget and back-off of `options`; the wait
    /// budget starts now.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] when `options` fail [`LockOptions::validate`].
    pub fn new(name: LockName, options: &LockOptions) -> Result<Self, LockError> {
        options.validate()?;
        Ok(Self {
            name,
            ttl: options.ttl,
            wait: options.wait,
            backoff: options.backoff.clone(),
            started: Instant::now(),
        })
    }

    /// The same request as one try (a zero wait budget), for a layer that must tell a wait
    /// from a slow store (see `layer::Metrics`); the original keeps its own budget.
    pub fn one_try(&self) -> Self {
        Self {
            wait: Duration::ZERO,
            ..self.clone()
        }
    }

    /// The same request with what is left of its budget, starting now (for a second store
    /// asked after a first one: one budget for both).
    pub fn remaining(&self) -> Self {
        Self {
            wait: self.deadline().saturating_duration_since(Instant::now()),
            started: Instant::now(),
            ..self.clone()
        }
    }

    /// The lock to acquire.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait budget (zero: one try).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The back-off for stores without push wake-ups.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// When the request was made.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// When the wait budget runs out.
    pub fn deadline(&self) -> Instant {
        self.started + self.wait
    }

    /// The [`LockError::Timeout`] for this request.
    pub fn timeout_error(&self) -> LockError {
        LockError::Timeout {
            name: self.name.to_string(),
            waited: self.started.elapsed(),
        }
    }
}
