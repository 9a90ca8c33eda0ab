//! The test environment's variables (`cargo xtask test` sets them).

use crate::Failure;

/// The value of the variable `name`, or a failure that says how to set it. A blank value
/// counts as unset.
///
/// # Errors
/// `<name> is not set; run `cargo xtask test`` when it is unset, blank or not UTF-8.
pub fn env_var(name: &str) -> Result<String, Failure> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Ok(value),
        _ => Err(Failure(format!(
            "{name} is not set; run `cargo xtask test`"
        ))),
    }
}
