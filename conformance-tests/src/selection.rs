//! What one run covers, as `cargo xtask compare --only STORE,... --workload NAME,... --quick`
//! asks the suites and benchmarks it starts, through the environment: which stores
//! ([`ONLY_VAR`]), which workloads of the benchmarks ([`WORKLOAD_VAR`]) and whether they
//! measure briefly ([`QUICK_VAR`]).

/// Comma-separated store names; when set, only those stores run. A name matches a store's
/// label exactly, or the label's part before `(` (`redlock` is `redlock(5)`).
pub const ONLY_VAR: &str = "LOCK_COMPARE_ONLY";

/// When set (to anything), benchmarks measure a tenth of their rounds and, of the runs of
/// separate clients, only the first (16 clients holding 1 ms), a third as long: a run of a
/// few minutes.
pub const QUICK_VAR: &str = "LOCK_COMPARE_QUICK";

/// Comma-separated workloads of the store benchmarks; when set, only those run:
/// [`UNCONTENDED`], [`CLIENTS`], [`SWEEP`] and [`RENEWAL`].
pub const WORKLOAD_VAR: &str = "LOCK_COMPARE_WORKLOAD";

/// Comma-separated numbers of clients; when set, of the runs of separate clients on one lock
/// ([`CLIENTS`]) only those with that many clients run (see [`fleet_size`]).
pub const FLEET_SIZES_VAR: &str = "LOCK_COMPARE_CLIENTS";

/// The workload of one client (the uncontended cycle against the raw floor, tasks of one
/// client on one lock, batched renewals).
pub const UNCONTENDED: &str = "uncontended";

/// The workload of separate clients on one lock (2, 16, 100 and 1,000 of them), peers beside.
pub const CLIENTS: &str = "clients";

/// The client sweep: 1 to 64 separate clients on many names (see
/// [`crate::bench::sweep_report`]).
pub const SWEEP: &str = "sweep";

/// The renewal cost: 10,000 locks held by one client (see
/// [`crate::bench::renewal_report`]).
pub const RENEWAL: &str = "renewal";

/// Whether the benchmarks' workload `name` runs (see [`WORKLOAD_VAR`]).
pub fn workload(name: &str) -> bool {
    std::env::var(WORKLOAD_VAR).map_or(true, |names| names.split(',').any(|n| n.trim() == name))
}

/// Whether the runs of `clients` separate clients on one lock run: every size unless
/// [`FLEET_SIZES_VAR`] names others (a part that is not a number matches no size).
pub fn fleet_size(clients: usize) -> bool {
    std::env::var(FLEET_SIZES_VAR).map_or(true, |sizes| {
        sizes
            .split(',')
            .any(|size| size.trim().parse::<usize>().is_ok_and(|n| n == clients))
    })
}

/// Whether `label` is one of `names` (see [`ONLY_VAR`]).
pub fn matches(names: &str, label: &str) -> bool {
    let bare = label.split('(').next().unwrap_or(label);
    names
        .split(',')
        .map(str::trim)
        .any(|name| name == label || name == bare)
}

/// Whether the store labelled `label` runs: every store unless [`ONLY_VAR`] names others.
pub fn selected(label: &str) -> bool {
    std::env::var(ONLY_VAR).map_or(true, |names| matches(&names, label))
}

/// Whether a migration pair `from -> to` runs: both its stores do.
pub fn pair_selected(from: &str, to: &str) -> bool {
    selected(from) && selected(to)
}

/// Whether benchmarks measure briefly (see [`QUICK_VAR`]).
pub fn quick() -> bool {
    std::env::var_os(QUICK_VAR).is_some()
}

/// How long a run of separate clients (or a step of the sweep) lasts: `full`, or a third of
/// it in a quick run.
pub fn run_for(full: std::time::Duration) -> std::time::Duration {
    if quick() { full / 3 } else { full }
}

/// `full`, or a tenth of it (at least 1) in a quick run.
pub fn scaled(full: usize) -> usize {
    if quick() { (full / 10).max(1) } else { full }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_matches_a_label_with_or_without_its_count() {
        assert!(matches("redis,redlock", "redlock(5)"));
        assert!(matches("redis, redlock", "redis"));
        assert!(matches("zookeeper-ensemble(3)", "zookeeper-ensemble(3)"));
        assert!(!matches("redis", "redis-cluster"));
        assert!(!matches("zookeeper", "zookeeper-ensemble(3)"));
        assert!(!matches("", "redis"));
    }
}
