//! The fenced resource: what a lock protects, refusing writes with a fence below the highest
//! it accepted.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::history::{Nanos, Write};

/// A resource that keeps the highest fence it accepted per lock and rejects writes with a
/// lower one, recording every write in its own order. Built with `check_fences == false` it
/// accepts everything: the campaign's negative control (with it, stale writes get through
/// and the checker must say so).
#[derive(Debug)]
pub struct Resource {
    check_fences: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    highest: HashMap<String, u64>,
    log: Vec<Write>,
}

impl Resource {
    /// A resource that checks fences (or, with `false`, one that does not).
    pub fn new(check_fences: bool) -> Self {
        Self {
            check_fences,
            state: Mutex::default(),
        }
    }

    /// `worker` writes under `name` with `fence` at `at`; whether the resource accepted it.
    /// A fence equal to the highest accepted is accepted (the same holder writing again).
    pub fn write(&self, name: &str, fence: u64, worker: u32, at: Nanos) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let highest = state.highest.get(name).copied();
        let accepted = !self.check_fences || highest.is_none_or(|h| fence >= h);
        if accepted && highest.is_none_or(|h| fence > h) {
            state.highest.insert(name.to_owned(), fence);
        }
        let seq = state.log.len() as u64;
        state.log.push(Write {
            seq,
            name: name.to_owned(),
            fence,
            worker,
            at,
            accepted,
        });
        accepted
    }

    /// Every write so far, in the order the resource received them.
    pub fn log(&self) -> Vec<Write> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .log
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_fence_is_rejected_unless_unchecked() {
        let checked = Resource::new(true);
        assert!(checked.write("a", 5, 1, 0));
        assert!(!checked.write("a", 4, 2, 1));
        assert!(checked.write("a", 5, 1, 2));
        assert!(checked.write("b", 1, 2, 3), "names are apart");
        let log = checked.log();
        assert_eq!(log.len(), 4);
        assert_eq!(log[1].seq, 1);
        assert!(!log[1].accepted);

        let unchecked = Resource::new(false);
        assert!(unchecked.write("a", 5, 1, 0));
        assert!(unchecked.write("a", 4, 2, 1));
    }
}
