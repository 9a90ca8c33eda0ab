//! The leases this client took after waiting in the queue, so that their release goes straight
//! to the hand-off batch ([`queue::release_batch`](super::queue::release_batch)).
//!
//! A release first tries the one statement that frees the lease when nobody queues
//! ([`queue::release_alone`](super::queue::release_alone)); when somebody does, it refuses,
//! and the batch that hands the lease over follows: two round trips on the way from one
//! holder to the next. A lease taken after waiting was contended a moment ago, so its release
//! sends the batch at once (the batch also frees a lease nobody waits for). In the general log
//! of 16 clients on one lock, every release sent both.

use std::{
    collections::HashSet,
    sync::{Mutex, MutexGuard, PoisonError},
};

use lock_core::backend::LeaseToken;

/// How many leases are remembered at most: past it the set starts again (a lease forgotten
/// only costs its release the extra round trip), so leases never released (expired, lost)
/// cannot make it grow without end.
const MOST: usize = 10_000;

/// The tokens of the leases taken after waiting and not released yet.
#[derive(Debug, Default)]
pub(crate) struct Waited {
    tokens: Mutex<HashSet<String>>,
}

impl Waited {
    fn tokens(&self) -> MutexGuard<'_, HashSet<String>> {
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers that the lease of `token` was taken after waiting.
    pub(crate) fn mark(&self, token: &LeaseToken) {
        let mut tokens = self.tokens();
        if tokens.len() >= MOST {
            tokens.clear();
        }
        tokens.insert(token.as_str().to_owned());
    }

    /// Whether the lease of `token` was taken after waiting; forgets it.
    pub(crate) fn take(&self, token: &LeaseToken) -> bool {
        self.tokens().remove(token.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_remembered_until_its_release_asks() {
        let waited = Waited::default();
        let (a, b) = (LeaseToken::random(), LeaseToken::random());
        waited.mark(&a);
        assert!(!waited.take(&b));
        assert!(waited.take(&a));
        assert!(!waited.take(&a));
    }

    #[test]
    fn the_set_never_grows_past_its_bound() {
        let waited = Waited::default();
        for _ in 0..MOST + 5 {
            waited.mark(&LeaseToken::random());
        }
        assert!(waited.tokens().len() <= MOST);
    }
}
