//! The store's server processes, as the operating system sees them: which they are (the pid
//! files `cargo xtask services up` writes) and what they use (CPU time, resident memory, read
//! from `/proc`).

use std::{path::PathBuf, time::Duration};

use crate::SERVICES_DIR_VAR;

/// The pids of the server instances `instances` (directories under [`SERVICES_DIR_VAR`],
/// each with a `pid` file, or with one per node below it, as Redis Cluster's).
pub(crate) fn server_pids(instances: &[&str]) -> Vec<u32> {
    let Some(root) = std::env::var_os(SERVICES_DIR_VAR).map(PathBuf::from) else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for instance in instances {
        let dir = root.join(instance);
        let mut files = vec![dir.join("pid")];
        if let Ok(entries) = std::fs::read_dir(&dir) {
            files.extend(entries.flatten().map(|e| e.path().join("pid")));
        }
        pids.extend(files.iter().filter_map(|file| {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|text| text.trim().parse::<u32>().ok())
        }));
    }
    pids
}

/// CPU time (user + system) of `pid` so far, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis; utime and stime are the 12th and
    // 13th of them, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Resident memory of `pid`, in KiB, from `/proc/<pid>/status`.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The summed CPU time of `pids`, `None` when one cannot be read.
pub(crate) fn total_cpu(pids: &[u32]) -> Option<Duration> {
    pids.iter().map(|&pid| cpu_time(pid)).sum()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let me = std::process::id();
        assert!(rss_kib(me).is_some_and(|kib| kib > 0));
        let before = cpu_time(me).unwrap();
        // Burn CPU until the process's user + system time has grown by 100 ms (another
        // field of `/proc/<pid>/stat`, one that does not grow with CPU use, never would).
        let start = Instant::now();
        let mut x = 0u64;
        let mut used = Duration::ZERO;
        while used < Duration::from_millis(100) && start.elapsed() < Duration::from_secs(20) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            used = cpu_time(me).unwrap().saturating_sub(before);
        }
        assert!(
            used >= Duration::from_millis(100),
            "{used:?} of CPU in 20 s"
        );
    }
}
