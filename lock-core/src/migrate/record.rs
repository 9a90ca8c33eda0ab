//! [`MigrationRecord`]: where a migration's authority is, only ever moved forward.

use std::{
    fmt,
    sync::{Arc, Mutex, PoisonError},
};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::LockError;

/// Which store issues fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Authority {
    /// The store locks are moving from (fences of generation `generation`).
    From,
    /// The store locks are moving to (fences of generation `generation + 1`).
    To,
}

/// A migration's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The generation of `from`'s fences; `to`'s are one above.
    pub generation: u64,
    /// Which store issues fences.
    pub authority: Authority,
}

impl Record {
    /// The generation of the fences issued now.
    pub fn fence_generation(&self) -> u64 {
        match self.authority {
            Authority::From => self.generation,
            Authority::To => self.generation + 1,
        }
    }

    /// Whether `next` may follow `self`: the same generation with authority moving to `to`,
    /// or a later generation.
    pub fn precedes(&self, next: &Self) -> bool {
        (next.generation, next.authority) > (self.generation, self.authority)
    }
}

/// Where a migration's [`Record`] lives: a store whose reads are linearizable (one server, a
/// ZooKeeper ensemble, MySQL), read by dual holders after they hold both locks.
#[async_trait]
pub trait MigrationRecord: Send + Sync + fmt::Debug {
    /// Creates the record, at generation 0 with authority `from`, unless there is one; the
    /// record now. (A record that goes missing later is an error, never a new start: the
    /// store lost it, and starting over would send fences back.)
    ///
    /// # Errors
    /// Store failures.
    async fn start(&self) -> Result<Record, LockError> {
        self.read().await
    }

    /// The record now.
    ///
    /// # Errors
    /// Store failures.
    async fn read(&self) -> Result<Record, LockError>;

    /// Moves the record from `current` to `next`; false when it was not `current` any more.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] when `next` does not follow `current` (the record never
    /// goes back); store failures.
    async fn advance(&self, current: &Record, next: &Record) -> Result<bool, LockError>;
}

/// A record kept in this process (tests, and the in-memory store).
#[derive(Debug, Clone)]
pub struct MemoryRecord {
    record: Arc<Mutex<Record>>,
}

impl MemoryRecord {
    /// A record at `generation`, authority `from`.
    pub fn new(generation: u64) -> Self {
        Self {
            record: Arc::new(Mutex::new(Record {
                generation,
                authority: Authority::From,
            })),
        }
    }
}

#[async_trait]
impl MigrationRecord for MemoryRecord {
    async fn read(&self) -> Result<Record, LockError> {
        Ok(*self.record.lock().unwrap_or_else(PoisonError::into_inner))
    }

    async fn advance(&self, current: &Record, next: &Record) -> Result<bool, LockError> {
        if !current.precedes(next) {
            return Err(LockError::invalid_options(format!(
                "a migration record only moves forward: {current:?} cannot become {next:?}"
            )));
        }
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        if *record != *current {
            return Ok(false);
        }
        *record = *next;
        Ok(true)
    }
}
