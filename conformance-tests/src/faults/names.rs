//! Lock names of their own for each case, so runs and cases never meet in the store.

use lock_core::LockName;

use crate::Failure;

/// A fresh lock name, `faults/<tag>/<16 random hex digits>`.
///
/// # Errors
/// When `tag` makes the name invalid (too long, say).
pub fn unique_name(tag: &str) -> Result<LockName, Failure> {
    LockName::new(format!("faults/{tag}/{:016x}", rand::random::<u64>()))
        .map_err(|e| Failure(format!("lock name for `{tag}`: {e}")))
}
