//! The renewal cost: many locks held by one client, renewed as its watchdog renews holds that
//! fall due together (one `renew_many` of them all), period after period. Per period: how long
//! the call took, how many round trips it made at most, what the store's servers counted, and
//! the CPU time their processes used.
//!
//! Round trips are counted on the client's side: the TCP segments carrying data that this
//! process sent to the store's servers during the period (`data_segs_out` of its sockets, as
//! `ss` reports them). Each round trip sends at least one, so they are an upper bound; a
//! pipeline or a batch of statements sent in one write is one segment per 64 KiB or so.

use std::{
    collections::HashMap,
    process::Command,
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt, stream};
use lock_core::{
    Lease, LockBackend, LockName, LockOptions,
    backend::{AcquireRequest, Grant},
};
use serde::{Deserialize, Serialize};

use super::{
    ServerCounters, Stats, histogram, record,
    server_process::{server_pids, total_cpu},
    stats,
};

/// How many locks one client holds.
pub const RENEWAL_LOCKS: usize = 10_000;

/// How many renewal periods are measured (2 in a quick run).
pub const RENEWAL_PERIODS: usize = 3;

/// How many acquisitions (and releases) of the held locks are in flight at once.
const IN_FLIGHT: usize = 256;

/// What renewing many held locks cost, per period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Renewal {
    /// Locks held by the one client.
    pub locks: usize,
    /// The time of one period's renewals (one `renew_many` of every lock).
    pub period: Stats,
    /// At most this many round trips per period: the data segments the client sent (see the
    /// module's documentation); `None` when `ss` could not tell, or a connection closed during a
    /// period.
    pub round_trips: Option<f64>,
    /// The operations the store's servers counted per period (see
    /// [`ServerCounters::operations`]).
    pub operations: f64,
    /// What one operation is ("commands", "statements").
    pub operations_are: String,
    /// CPU time the servers' processes used per period, when they were found.
    pub server_cpu: Option<Duration>,
    /// Renewals answered with an error (each lease is current, so a renewal should succeed).
    pub not_renewed: usize,
}

impl Renewal {
    /// Round trips per 100 locks per period, at most.
    pub fn round_trips_per_100(&self) -> Option<f64> {
        self.round_trips
            .map(|trips| trips * 100.0 / self.locks.max(1) as f64)
    }
}

/// `locks` locks (a tenth in a quick run) acquired through `backend`, renewed with one
/// `renew_many` per period for [`RENEWAL_PERIODS`] periods, then released. `counters` are the
/// store's servers' counters; `instances` name its server instances (for their processes'
/// CPU time and listening ports).
///
/// # Errors
/// An acquisition, a renewal batch failing as a whole, a release, or a counter that could not
/// be read, as text. The locks acquired are released first.
pub async fn renewal<B, S>(
    backend: &B,
    counters: &S,
    locks: usize,
    instances: &[&str],
) -> Result<Renewal, String>
where
    B: LockBackend + ?Sized,
    S: ServerCounters,
{
    let locks = crate::selection::scaled(locks);
    let periods = if crate::selection::quick() {
        2
    } else {
        RENEWAL_PERIODS
    };
    let prefix = format!("bench/renewal/{:016x}", rand::random::<u64>());
    let options = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(30));
    // The grants are kept until the locks are released: a backend may end a hold whose
    // end signal nobody listens to any more (the row lock does).
    let acquired: Vec<Result<Grant, String>> = stream::iter(0..locks)
        .map(|i| {
            let (prefix, options) = (&prefix, &options);
            async move {
                let name = LockName::new(format!("{prefix}/{i}")).map_err(|e| e.to_string())?;
                let request = AcquireRequest::new(name, options).map_err(|e| e.to_string())?;
                backend.acquire(&request).await.map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let (grants, failed): (Vec<_>, Vec<_>) = acquired.into_iter().partition(Result::is_ok);
    let grants: Vec<Grant> = grants.into_iter().filter_map(Result::ok).collect();
    let leases: Vec<Lease> = grants.iter().map(|grant| grant.lease.clone()).collect();
    let measured = match failed.into_iter().find_map(Result::err) {
        Some(error) => Err(format!("acquiring {locks} locks to renew: {error}")),
        None => {
            let leases = &leases;
            let renew = async || {
                let results = backend
                    .renew_many(leases)
                    .await
                    .map_err(|e| format!("renewing {} held locks: {e}", leases.len()))?;
                Ok(results.iter().filter(|r| r.is_err()).count())
            };
            periods_of(counters, leases.len(), (periods, instances), renew).await
        }
    };
    let released = release_all(backend, &leases).await;
    drop(grants);
    let renewal = measured?;
    released?;
    Ok(renewal)
}

/// The renewal workload of `report`'s store: `locks` locks held through `backend`
/// ([`RENEWAL_LOCKS`] where the store takes that many; see [`renewal`]), added to `report`
/// (see [`super::Report::renewal`]); nothing when the `renewal` workload is left out (see
/// [`crate::selection::WORKLOAD_VAR`]).
///
/// # Errors
/// As [`renewal`].
pub async fn renewal_report<B, S>(
    report: &mut super::Report,
    backend: &B,
    counters: &S,
    locks: usize,
    instances: &[&str],
) -> Result<(), String>
where
    B: LockBackend + ?Sized,
    S: ServerCounters,
{
    if !crate::selection::workload(crate::selection::RENEWAL) {
        return Ok(());
    }
    let measured = renewal(backend, counters, locks, instances).await?;
    report.renewal(&measured);
    Ok(())
}

/// The renewal workload for a peer library on the same servers: `locks` locks (a tenth in a
/// quick run) taken by `acquire` (given each lock's name), [`RENEWAL_PERIODS`] periods in which
/// `renew` renews them all once (as a user of the peer would: the peer has no batch) and
/// answers how many renewals failed, then `release`; added to `report` after the peer's name
/// (see [`super::Report::peer_renewal`]), or a failed line. Nothing when the `renewal`
/// workload is left out.
pub async fn peer_renewal_report<H, S>(
    report: &mut super::Report,
    (peer, counters): (&str, &S),
    locks: usize,
    instances: &[&str],
    (acquire, renew, release): (
        impl AsyncFn(String) -> Result<H, String>,
        impl AsyncFn(&[H]) -> Result<usize, String>,
        impl AsyncFn(&[H]),
    ),
) where
    S: ServerCounters,
{
    if !crate::selection::workload(crate::selection::RENEWAL) {
        return;
    }
    let locks = crate::selection::scaled(locks);
    let periods = if crate::selection::quick() {
        2
    } else {
        RENEWAL_PERIODS
    };
    let prefix = format!("bench/peer-renewal/{:016x}", rand::random::<u64>());
    let acquired: Vec<Result<H, String>> = stream::iter(0..locks)
        .map(|i| acquire(format!("{prefix}/{i}")))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let (held, failed): (Vec<_>, Vec<_>) = acquired.into_iter().partition(Result::is_ok);
    let held: Vec<H> = held.into_iter().filter_map(Result::ok).collect();
    let measured = match failed.into_iter().find_map(Result::err) {
        Some(error) => Err(format!("acquiring {locks} locks to renew: {error}")),
        None => {
            let held = &held;
            periods_of(counters, locks, (periods, instances), async || {
                renew(held).await
            })
            .await
        }
    };
    release(&held).await;
    let what = format!("{peer}: renewing {locks} held locks");
    match measured {
        // A renewal that failed makes the cost figures meaningless (a peer may retry it).
        Ok(renewal) if renewal.not_renewed > 0 => report.failed(
            &what,
            &format!(
                "{} renewals failed over {periods} periods",
                renewal.not_renewed
            ),
        ),
        Ok(renewal) => report.peer_renewal(peer, &renewal),
        Err(error) => report.failed(&what, &error),
    }
}

/// The measured periods (see [`renewal`]) of `locks` held locks: `periods` calls of `renew`,
/// which renews every lock once and answers how many renewals failed; `instances` name the
/// store's server instances.
async fn periods_of<S>(
    counters: &S,
    locks: usize,
    (periods, instances): (usize, &[&str]),
    renew: impl AsyncFn() -> Result<usize, String>,
) -> Result<Renewal, String>
where
    S: ServerCounters,
{
    let pids = server_pids(instances);
    let ports = listening_ports(&pids);
    let mut times = histogram()?;
    let (mut segments, mut operations, mut cpu) = (Some(0), 0, Some(Duration::ZERO));
    let mut not_renewed = 0;
    for _ in 0..periods {
        // The counters' own reads go before and after the segments are counted.
        let operations_before = counters.operations().await?;
        let (segments_before, cpu_before) = (sent_segments(&ports), total_cpu(&pids));
        let started = Instant::now();
        let failed = renew().await?;
        record(&mut times, started.elapsed());
        let (cpu_after, segments_after) = (total_cpu(&pids), sent_segments(&ports));
        let operations_after = counters.operations().await?;
        not_renewed += failed;
        operations += operations_after.saturating_sub(operations_before);
        let sent = segments_before
            .zip(segments_after)
            .and_then(|(before, after)| sent_between(&before, &after));
        segments = segments.zip(sent).map(|(sum, sent)| sum + sent);
        cpu = cpu
            .zip(cpu_before.zip(cpu_after))
            .map(|(sum, (before, after))| sum + after.saturating_sub(before));
    }
    let per_period = |total: u64| total as f64 / periods.max(1) as f64;
    Ok(Renewal {
        locks,
        period: stats(&times),
        round_trips: segments.filter(|_| !ports.is_empty()).map(per_period),
        operations: per_period(operations),
        operations_are: counters.operations_are().to_owned(),
        server_cpu: cpu
            .filter(|_| !pids.is_empty())
            .map(|total| total / u32::try_from(periods.max(1)).unwrap_or(u32::MAX)),
        not_renewed,
    })
}

/// Releases every lease, [`IN_FLIGHT`] at a time.
///
/// # Errors
/// The first release that failed, as text.
async fn release_all<B: LockBackend + ?Sized>(backend: &B, leases: &[Lease]) -> Result<(), String> {
    stream::iter(leases)
        .map(|lease| async move { backend.release(lease).await.map_err(|e| e.to_string()) })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}

/// Runs `ss` with `args` (TCP sockets, numeric, with their processes, no header).
fn ss(args: &[&str]) -> Option<String> {
    let output = Command::new("ss").args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The TCP ports the processes `pids` listen on.
fn listening_ports(pids: &[u32]) -> Vec<u16> {
    ss(&["-tlnpH"]).map_or_else(Vec::new, |text| ports_of(&text, pids))
}

/// The local ports of the listening sockets of `pids` in `ss -tlnpH`'s `text`.
fn ports_of(text: &str, pids: &[u32]) -> Vec<u16> {
    let mut ports: Vec<u16> = text
        .lines()
        .filter(|line| pids.iter().any(|pid| line.contains(&format!("pid={pid},"))))
        .filter_map(|line| {
            let local = line.split_whitespace().nth(3)?;
            local.rsplit_once(':')?.1.parse().ok()
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The data segments this process has sent so far on each of its open TCP connections to
/// `ports`, by local address (`data_segs_out`, as `ss` reports it); `None` when `ss` could not
/// tell. Two readings give what was sent between them ([`sent_between`]).
pub fn sent_segments(ports: &[u16]) -> Option<HashMap<String, u64>> {
    let text = ss(&["-tinpH", "state", "established"])?;
    Some(segments_to(&text, ports, std::process::id()))
}

/// The data segments sent between two readings of [`sent_segments`]: on each connection of
/// `after`, what it sent since `before` (all of it for a connection opened meanwhile).
/// `None` when a connection of `before` closed meanwhile: what it sent before closing is
/// unknown.
pub fn sent_between(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> Option<u64> {
    if before.keys().any(|socket| !after.contains_key(socket)) {
        return None;
    }
    Some(
        after
            .iter()
            .map(|(socket, sent)| sent.saturating_sub(before.get(socket).copied().unwrap_or(0)))
            .sum(),
    )
}

/// In `ss -tinpH`'s `text` (a line per socket, then an indented line of its TCP details), the
/// `data_segs_out` of each socket of `pid` whose peer port is one of `ports`, by local
/// address.
fn segments_to(text: &str, ports: &[u16], pid: u32) -> HashMap<String, u64> {
    let owner = format!("pid={pid},");
    let mut sent = HashMap::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let details = lines
            .next_if(|next| next.starts_with(char::is_whitespace))
            .unwrap_or_default();
        // With a state given, the columns are: Recv-Q, Send-Q, local, peer, process.
        let columns: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(peer)) = (columns.get(2), columns.get(3)) else {
            continue;
        };
        let peer_port = peer
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse::<u16>().ok());
        if !line.contains(&owner) || !peer_port.is_some_and(|port| ports.contains(&port)) {
            continue;
        }
        let segments = details
            .split_whitespace()
            .find_map(|field| field.strip_prefix("data_segs_out:"))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        sent.insert((*local).to_owned(), segments);
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    const ESTABLISHED: &str = "\
0      0      127.0.0.1:41000      127.0.0.1:6379 users:((\"redis\",pid=77,fd=9))
\t cubic rto:204 segs_out:10 data_segs_out:9 data_segs_in:9
0      0      127.0.0.1:41001      127.0.0.1:6379 users:((\"redis\",pid=77,fd=10))
\t cubic rto:204 segs_out:4
0      0      127.0.0.1:6379      127.0.0.1:41000 users:((\"redis-server\",pid=5,fd=8))
\t cubic rto:204 data_segs_out:9
0      0      127.0.0.1:41002      127.0.0.1:3306 users:((\"redis\",pid=77,fd=11))
\t cubic rto:204 data_segs_out:100
0      0      127.0.0.1:41003      127.0.0.1:6379 users:((\"other\",pid=770,fd=3))
\t cubic rto:204 data_segs_out:1000
";

    fn sum(sent: &HashMap<String, u64>) -> u64 {
        sent.values().sum()
    }

    #[test]
    fn the_segments_are_those_this_process_sent_to_the_ports() {
        // The first socket's 9; the second sent no data; the server's own socket, the
        // socket to another port and another process's are not counted.
        let to_redis = segments_to(ESTABLISHED, &[6379], 77);
        assert_eq!(sum(&to_redis), 9);
        assert_eq!(to_redis.get("127.0.0.1:41000"), Some(&9));
        assert_eq!(to_redis.get("127.0.0.1:41001"), Some(&0));
        assert_eq!(sum(&segments_to(ESTABLISHED, &[6379, 3306], 77)), 109);
        assert!(segments_to(ESTABLISHED, &[], 77).is_empty());
    }

    #[test]
    fn a_connection_closed_between_readings_leaves_the_count_unknown() {
        let reading = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
            pairs.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect()
        };
        let before = reading(&[("a", 100), ("b", 5)]);
        // `b` sent 2 more, `c` opened and sent 3.
        let after = reading(&[("a", 100), ("b", 7), ("c", 3)]);
        assert_eq!(sent_between(&before, &after), Some(5));
        // `a` closed, its 100 gone from the sum: unknown, not 100 fewer.
        let closed = reading(&[("b", 7)]);
        assert_eq!(sent_between(&before, &closed), None);
    }

    #[test]
    fn the_ports_are_those_the_servers_listen_on() {
        let listening = "\
LISTEN 0      511      127.0.0.1:6379      0.0.0.0:* users:((\"redis-server\",pid=5,fd=6))
LISTEN 0      511      127.0.0.1:16379      0.0.0.0:* users:((\"redis-server\",pid=5,fd=7))
LISTEN 0      50       127.0.0.1:2181      0.0.0.0:* users:((\"java\",pid=55,fd=9))
";
        assert_eq!(ports_of(listening, &[5]), vec![6379, 16379]);
        assert_eq!(ports_of(listening, &[5, 55]), vec![2181, 6379, 16379]);
        assert!(ports_of(listening, &[6]).is_empty());
    }

    #[test]
    fn this_process_counts_the_segments_it_sends() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        client.set_nodelay(true).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let before = sum(&sent_segments(&[port]).expect("ss runs"));
        // Three request/answer exchanges: three segments sent at least.
        for _ in 0..3 {
            client.write_all(b"ping").unwrap();
            let mut buf = [0; 4];
            server.read_exact(&mut buf).unwrap();
            server.write_all(b"pong").unwrap();
            client.read_exact(&mut buf).unwrap();
        }
        let after = sum(&sent_segments(&[port]).unwrap());
        assert!(after >= before + 3, "{before} then {after}");
        // The server's socket is this process's too, but its peer port is not `port`.
        assert!(after - before < 6, "{before} then {after}");
    }
}
