//! The network between a campaign's workers and its store's servers: a TCP relay
//! ([`Relay`]) per server, on loopback, that workers connect through, and the faults of that
//! network ([`Links::begin`]): latency, a dropped link, and a blackhole (a partition with
//! half-open connections: no reset, no close).
//!
//! Workers find the relays through the same variables `cargo xtask services env` prints,
//! rewritten for their processes only ([`Links::env`]); the campaign's own connections (its
//! `KILL CONNECTION`, its questions to the ensemble) go to the servers directly.
//!
//! Redis Cluster is not relayed: its nodes tell clients their own addresses (`CLUSTER
//! SLOTS`, `MOVED`), so a client would leave the relay after its first question. Its
//! campaign has no link faults; its servers' restarts remain.

use std::{net::SocketAddr, time::Duration};

use conformance_tests::faults::Relay;
use rand::{Rng, rngs::StdRng};

use crate::{Fault, clock, stores};

/// The variable (as `cargo xtask services env` prints it) naming each store's servers: a URL,
/// a `host:port`, or a comma-separated list of either.
fn variable(store: &str) -> Option<&'static str> {
    match store {
        "redis" => Some("LOCK_TEST_REDIS_URL"),
        "redlock" => Some("LOCK_TEST_REDLOCK_URLS"),
        "mysql-lease" | "mysql-rowlock" => Some("LOCK_TEST_MYSQL_URL"),
        "zookeeper" => Some("LOCK_TEST_ZK_ADDR"),
        "zk-ensemble" => Some("LOCK_TEST_ZK_ENSEMBLE"),
        _ => None,
    }
}

/// Where `entry` (a URL or a `host:port`) puts its `host:port`: the byte range.
fn authority(entry: &str) -> std::ops::Range<usize> {
    let start = entry.find("://").map_or(0, |at| at + 3);
    let end = entry[start..]
        .find(['/', '?'])
        .map_or(entry.len(), |at| start + at);
    // Credentials (`user:password@`) are not the address.
    let start = entry[start..end]
        .rfind('@')
        .map_or(start, |at| start + at + 1);
    start..end
}

/// Whether a latency of `delay` each way makes the store unavailable: a round trip then
/// outlasts its client's wait for an answer, so every request fails (an outage, not a lock
/// that is stuck).
fn latency_is_outage(delay: Duration, request_timeout: Duration) -> bool {
    delay * 2 >= request_timeout
}

/// Workers' links to their store's servers.
#[derive(Debug)]
pub struct Links {
    relays: Vec<Relay>,
    env: Vec<(String, String)>,
    /// How long the store's client waits for one answer ([`stores::request_timeout`]).
    request_timeout: Duration,
}

/// A link fault in progress: end it with [`Links::end`] after [`LinkFault::lasts`].
#[derive(Debug)]
pub struct LinkFault {
    what: String,
    outage: bool,
    from: crate::Nanos,
    lasts: Duration,
}

impl Links {
    /// Relays to every server of `store`; `None` for a store whose links are not relayed
    /// (Redis Cluster, see the module's documentation).
    ///
    /// # Errors
    /// The store's variable missing, an address that does not resolve, or no local port.
    pub async fn start(store: &str) -> Result<Option<Self>, String> {
        let Some(name) = variable(store) else {
            return Ok(None);
        };
        let value = std::env::var(name).map_err(|_| format!("{name} is not set"))?;
        let mut relays = Vec::new();
        let mut entries = Vec::new();
        for entry in value.split(',') {
            let range = authority(entry);
            let host = &entry[range.clone()];
            let upstream: SocketAddr = tokio::net::lookup_host(host)
                .await
                .map_err(|e| format!("{name}: `{host}`: {e}"))?
                .next()
                .ok_or_else(|| format!("{name}: `{host}` has no address"))?;
            let relay = Relay::start(upstream).await.map_err(|f| f.0)?;
            entries.push(format!(
                "{}{}{}",
                &entry[..range.start],
                relay.addr(),
                &entry[range.end..]
            ));
            relays.push(relay);
        }
        Ok(Some(Self {
            relays,
            env: vec![(name.to_owned(), entries.join(","))],
            request_timeout: stores::request_timeout(store),
        }))
    }

    /// The variables a worker process gets, pointing it at the relays.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Begins one fault of every link, meant to last about `ttl`:
    ///
    /// - **latency**: every piece of traffic waits 2-10 % of the TTL, each way, for 2-4 TTLs;
    ///   an outage where a round trip then outlasts what the store's client is sure to serve
    ///   ([`stores::request_timeout`]; Redlock: 100 ms, where its adaptive per-server wait
    ///   can no longer keep twice the round trip);
    /// - **drop**: every connection closed at once (workers reconnect);
    /// - **blackhole**: nothing passes for 1.5-3 TTLs and nobody is told (half-open
    ///   connections); what was sent meanwhile flows on once it ends, as TCP delivers it
    ///   after a partition. An outage: nobody can be served meanwhile.
    pub fn begin(&self, ttl: Duration, rng: &mut StdRng) -> LinkFault {
        let from = clock::now();
        let (what, outage, lasts) = match rng.random_range(0..3) {
            0 => {
                let delay = ttl.mul_f64(rng.random_range(0.02..0.10));
                for relay in &self.relays {
                    relay.delay(delay);
                }
                let what = format!("link-latency {} ms each way", delay.as_millis());
                let outage = latency_is_outage(delay, self.request_timeout);
                (what, outage, ttl.mul_f64(rng.random_range(2.0..4.0)))
            }
            1 => {
                for relay in &self.relays {
                    relay.cut_all();
                }
                let what = "link-drop (every connection closed)".to_owned();
                (what, false, Duration::ZERO)
            }
            _ => {
                for relay in &self.relays {
                    relay.partition(true);
                }
                let what = "link-blackhole (half-open)".to_owned();
                (what, true, ttl.mul_f64(rng.random_range(1.5..3.0)))
            }
        };
        LinkFault {
            what,
            outage,
            from,
            lasts,
        }
    }

    /// Ends `fault`: the links carry traffic as before; what it was.
    pub fn end(&self, fault: LinkFault) -> Fault {
        for relay in &self.relays {
            relay.delay(Duration::ZERO);
            relay.partition(false);
        }
        Fault {
            what: fault.what,
            from: fault.from,
            to: clock::now(),
            outage: fault.outage,
        }
    }
}

impl LinkFault {
    /// How long the fault should last.
    pub fn lasts(&self) -> Duration {
        self.lasts
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{authority, latency_is_outage};
    use crate::stores::request_timeout;

    #[test]
    fn latency_past_the_client_time_out_is_an_outage() {
        let ms = Duration::from_millis;
        // Redlock is sure to serve round trips of up to 100 ms (its wait, up to four times
        // its 50 ms per-server time-out, keeps twice the round trip): 50 ms each way is past.
        assert!(latency_is_outage(ms(50), request_timeout("redlock")));
        assert!(!latency_is_outage(ms(49), request_timeout("redlock")));
        // Redis waits 2 s: the campaign's 20-100 ms slows it down, no more.
        assert!(!latency_is_outage(ms(100), request_timeout("redis")));
    }

    #[test]
    fn the_address_of_every_spelling() {
        for (entry, host) in [
            ("redis://127.0.0.1:16379", "127.0.0.1:16379"),
            (
                "mysql://lock:lockpw@127.0.0.1:13306/locktest",
                "127.0.0.1:13306",
            ),
            ("redis://:pw@10.0.0.1:1?protocol=resp3", "10.0.0.1:1"),
            ("127.0.0.1:12181", "127.0.0.1:12181"),
        ] {
            assert_eq!(&entry[authority(entry)], host, "{entry}");
        }
    }
}
