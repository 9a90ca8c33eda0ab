//! The campaign's clock: the machine's monotonic clock, which every process of one machine
//! reads alike and the wall clock never steps.

use crate::history::Nanos;

/// Now, in nanoseconds of `CLOCK_MONOTONIC`.
pub fn now() -> Nanos {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    // Both parts are non-negative on this clock; a negative one would be a kernel bug, read
    // as zero.
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_moves_forward() {
        let a = super::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::now();
        assert!(b >= a + 2_000_000, "{a} then {b}");
    }
}
