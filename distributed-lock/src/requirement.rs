//! [`Requirement`]: a safety property a team states in its configuration
//! (`?require=strict-fencing,quorum`); a store that does not declare it is refused at
//! connect time, before any lock is taken.

use std::{fmt, str::FromStr};

use lock_core::{Capabilities, Clock, Failover, Fencing, LockError, WaitOrder, Wakeup};
use serde::{Deserialize, Serialize};

use crate::stores::declared;

/// A property of a store's declared [`Capabilities`] that a configuration can require.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Requirement {
    /// Fences strictly increase per name, also across store failures
    /// ([`Fencing::Strict`]).
    StrictFencing,
    /// No client's clock decides when a lease ends ([`Clock::Server`], or [`Clock::None`]
    /// where the session decides).
    ServerClock,
    /// A hold survives the failure of a minority of the store's nodes
    /// ([`Failover::Quorum`]).
    Quorum,
    /// Waiters are woken by the store when the lock is released ([`Wakeup::Push`]), not by
    /// polling.
    Push,
    /// Waiters are served in arrival order ([`WaitOrder::Fifo`]).
    Fifo,
    /// No waiter is passed over indefinitely ([`WaitOrder::Fifo`] or [`WaitOrder::Fair`]).
    Fair,
    /// A lease can be renewed or released from another process
    /// ([`Capabilities::portable_lease`]).
    PortableLease,
}

/// Every requirement, in the order the docs list them.
pub const REQUIREMENTS: [Requirement; 7] = [
    Requirement::StrictFencing,
    Requirement::ServerClock,
    Requirement::Quorum,
    Requirement::Push,
    Requirement::Fifo,
    Requirement::Fair,
    Requirement::PortableLease,
];

impl Requirement {
    /// The name in URLs and configs (`strict-fencing`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StrictFencing => "strict-fencing",
            Self::ServerClock => "server-clock",
            Self::Quorum => "quorum",
            Self::Push => "push",
            Self::Fifo => "fifo",
            Self::Fair => "fair",
            Self::PortableLease => "portable-lease",
        }
    }

    /// Whether `capabilities` declare this property.
    pub fn is_met_by(self, capabilities: &Capabilities) -> bool {
        match self {
            Self::StrictFencing => capabilities.fencing == Fencing::Strict,
            Self::ServerClock => capabilities.clock != Clock::Client,
            Self::Quorum => capabilities.failover == Failover::Quorum,
            Self::Push => capabilities.wakeup == Wakeup::Push,
            Self::Fifo => capabilities.order == WaitOrder::Fifo,
            Self::Fair => matches!(capabilities.order, WaitOrder::Fifo | WaitOrder::Fair),
            Self::PortableLease => capabilities.portable_lease,
        }
    }

    /// The stores that declare this property with their default settings (see
    /// [`declared`]).
    pub fn stores_with_it(self) -> Vec<&'static str> {
        declared()
            .into_iter()
            .filter(|(_, capabilities)| self.is_met_by(capabilities))
            .map(|(store, _)| store)
            .collect()
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Requirement {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        REQUIREMENTS
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = REQUIREMENTS.iter().map(|r| r.as_str()).collect();
                LockError::invalid_options(format!(
                    "`require` names {s:?}, which is no requirement; known: {}",
                    known.join(", ")
                ))
            })
    }
}

/// Parses a comma-separated list (`strict-fencing,quorum`), without repeats.
///
/// # Errors
/// [`LockError::InvalidOptions`] naming an unknown requirement.
pub(crate) fn parse_list(list: &str) -> Result<Vec<Requirement>, LockError> {
    let mut out: Vec<Requirement> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let requirement = item.parse()?;
        if !out.contains(&requirement) {
            out.push(requirement);
        }
    }
    Ok(out)
}

/// Checks `capabilities` (of `store`) against `required`.
///
/// # Errors
/// [`LockError::InvalidOptions`] saying which requirements `store` does not declare, and which
/// stores do.
pub(crate) fn check(
    store: &str,
    capabilities: &Capabilities,
    required: &[Requirement],
) -> Result<(), LockError> {
    let missing: Vec<String> = required
        .iter()
        .filter(|r| !r.is_met_by(capabilities))
        .map(|r| format!("`{r}` (declared by: {})", r.stores_with_it().join(", ")))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(LockError::invalid_options(format!(
        "the configuration requires what {store} does not declare: {}",
        missing.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_named() {
        for requirement in REQUIREMENTS {
            assert_eq!(
                requirement.as_str().parse::<Requirement>().ok(),
                Some(requirement)
            );
        }
        let error = parse_list("strict-fencing,quorom").unwrap_err();
        assert!(error.to_string().contains("\"quorom\""), "{error}");
        assert_eq!(
            parse_list("push, push,,fifo").ok(),
            Some(vec![Requirement::Push, Requirement::Fifo])
        );
    }

    #[test]
    fn a_weaker_store_is_refused_with_what_it_lacks_and_who_has_it() {
        let (_, redlock) = declared()
            .into_iter()
            .find(|(store, _)| *store == "redlock")
            .unwrap_or_else(|| panic!("redlock is declared"));
        let error = check(
            "redlock",
            &redlock,
            &[Requirement::Quorum, Requirement::StrictFencing],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("`strict-fencing` (declared by: memory, redis,"),
            "{error}"
        );
        assert!(!error.contains("`quorum`"), "{error}");
        assert!(check("redlock", &redlock, &[Requirement::Quorum]).is_ok());
    }
}
