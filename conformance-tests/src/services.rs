//! [`Services`]: the `stop` and `start` scripts `cargo xtask services up` writes for each
//! server, so a store under test can take its servers away and bring them back (an outage).
//! The scripts run through [`faults::Instance`](crate::faults::Instance); this is its form for
//! [`TestStore`](crate::TestStore) outages, which report [`LockError`]s and span two calls
//! (no guard).

use std::path::PathBuf;

use lock_core::LockError;

pub use crate::faults::SERVICES_DIR_VAR;
use crate::{Failure, faults::Instance};

/// The local servers of `cargo xtask services`, by instance name (`redis`, `mariadb`,
/// `redlock-0`, `redis-cluster`, ...).
#[derive(Debug, Clone)]
pub struct Services {
    root: PathBuf,
}

impl Services {
    /// The services whose directory [`SERVICES_DIR_VAR`] names.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the variable is not set.
    pub fn from_env() -> Result<Self, LockError> {
        let root = std::env::var_os(SERVICES_DIR_VAR).ok_or_else(|| {
            LockError::unavailable_msg(format!(
                "{SERVICES_DIR_VAR} is not set; run `cargo xtask test`"
            ))
        })?;
        Ok(Self { root: root.into() })
    }

    /// Stops each instance and waits until its process is gone.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when a script fails.
    pub async fn stop(&self, instances: &[&str]) -> Result<(), LockError> {
        for instance in instances {
            self.run(instance, "stop").await?;
        }
        Ok(())
    }

    /// Starts each instance and waits until it answers.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when a script fails.
    pub async fn start(&self, instances: &[&str]) -> Result<(), LockError> {
        for instance in instances {
            self.run(instance, "start").await?;
        }
        Ok(())
    }

    /// Starts every instance at once and waits until each answers: the nodes of an ensemble,
    /// none of which serves before a quorum of them runs.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when a script fails.
    pub async fn start_together(&self, instances: &[&str]) -> Result<(), LockError> {
        futures::future::try_join_all(instances.iter().map(|i| self.run(i, "start"))).await?;
        Ok(())
    }

    async fn run(&self, instance: &str, script: &str) -> Result<(), LockError> {
        Instance::in_root(&self.root, instance)
            .run(script)
            .await
            .map_err(|Failure(message)| LockError::unavailable_msg(message))
    }
}
