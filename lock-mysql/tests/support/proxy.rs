//! A TCP proxy in front of the test server (the fault kit's [`Relay`]) that can blackhole its
//! connections: after [`Proxy::blackhole`] nothing more is forwarded either way and the sockets
//! stay open, as on a half-open connection (a peer gone without a reset, a firewall dropping
//! packets); or that records what the client sends ([`Recording`]).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use conformance_tests::{
    Failure,
    faults::{Flow, Hook, Relay},
};

use super::wire;

/// A running proxy; it closes its connections once its last clone drops.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    relay: Arc<Relay>,
}

impl Proxy {
    /// Starts a proxy to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self, String> {
        Self::new(Relay::start(upstream).await)
    }

    /// Starts a proxy to `upstream` that records what clients send into `recording`.
    pub async fn recording(upstream: SocketAddr, recording: &Recording) -> Result<Self, String> {
        let streams = recording.0.clone();
        let relay = Relay::with_hook(upstream, move || {
            let log = Stream::default();
            if let Ok(mut all) = streams.lock() {
                all.push(log.clone());
            }
            Recorder(log)
        })
        .await;
        Self::new(relay)
    }

    fn new(relay: Result<Relay, Failure>) -> Result<Self, String> {
        let relay = relay.map_err(|Failure(why)| why)?;
        Ok(Self {
            addr: relay.addr(),
            relay: Arc::new(relay),
        })
    }

    /// From now on, nothing is forwarded (bytes read are dropped); connections stay open.
    pub fn blackhole(&self) {
        self.relay.blackhole();
    }

    /// `url` with its host and port replaced by the proxy's, TLS off (the proxy only forwards).
    pub fn url(&self, url: &str) -> Result<String, String> {
        let mut url = url::Url::parse(url).map_err(|e| e.to_string())?;
        url.set_host(Some("127.0.0.1")).map_err(|e| e.to_string())?;
        url.set_port(Some(self.addr.port()))
            .map_err(|()| "cannot set the port".to_owned())?;
        url.query_pairs_mut().append_pair("ssl-mode", "disabled");
        Ok(url.into())
    }
}

/// The address of the test server in `url`.
pub fn upstream(url: &str) -> Result<SocketAddr, String> {
    let url = url::Url::parse(url).map_err(|e| e.to_string())?;
    format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(3306)
    )
    .parse()
    .map_err(|e: std::net::AddrParseError| e.to_string())
}

/// The client-to-server bytes of one connection.
type Stream = Arc<Mutex<Vec<u8>>>;

/// Everything the clients of a recording [`Proxy`] sent, per connection.
#[derive(Debug, Clone, Default)]
pub struct Recording(Arc<Mutex<Vec<Stream>>>);

impl Recording {
    /// Every command the clients sent: statement texts (`COM_QUERY`, `COM_STMT_PREPARE`) and
    /// the payloads of `COM_STMT_EXECUTE`, which carry the bound parameter values.
    pub fn commands(&self) -> (Vec<String>, Vec<Vec<u8>>) {
        let streams = self.0.lock().map(|s| s.clone()).unwrap_or_default();
        let (mut texts, mut executes) = (Vec::new(), Vec::new());
        for stream in streams {
            let bytes = stream.lock().map(|b| b.clone()).unwrap_or_default();
            wire::commands(&bytes, &mut texts, &mut executes);
        }
        (texts, executes)
    }
}

/// The hook of one recorded connection.
struct Recorder(Stream);

impl Hook for Recorder {
    fn client_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        if let Ok(mut log) = self.0.lock() {
            log.extend_from_slice(bytes);
        }
        out.extend_from_slice(bytes);
        Flow::Forward
    }
}

impl Proxy {
    /// Starts a proxy to `upstream` that plays a `KILL QUERY` landing between two statements
    /// of a row-lock hold's parked batch (`.. SLEEP(..) ..` or `.. GET_LOCK(..) ..`): MariaDB
    /// then ends the batch without the rest of its answer, though the last answer it sent said
    /// more would follow, and the client waits for an answer that never comes. Here the answer
    /// to a parked batch is passed on up to its second OK, the wait's; if that OK says more
    /// results follow, the rest is dropped.
    pub async fn cutting_parks(upstream: SocketAddr) -> Result<Self, String> {
        let hook = || ParkCutter::new(row_lock_park, 2);
        Self::new(Relay::with_hook(upstream, hook).await)
    }

    /// Starts a proxy to `upstream` that cuts the connection carrying the next command whose
    /// bytes hold what `needle` was armed with, once it has passed that command on: the server
    /// runs it, and its answer never reaches the client (the connection is reset).
    pub async fn cutting_after(upstream: SocketAddr, needle: &Needle) -> Result<Self, String> {
        let needle = needle.clone();
        let hook = move || NeedleCutter(needle.clone());
        Self::new(Relay::with_hook(upstream, hook).await)
    }

    /// [`Proxy::cutting_parks`] for a lease waiter's park: a batch that carries the park's
    /// mark (the text a release's `KILL QUERY` looks for) has its answer cut after its first
    /// OK, if that OK says more results follow.
    pub async fn cutting_lease_parks(upstream: SocketAddr) -> Result<Self, String> {
        let hook = || ParkCutter::new(lease_park, 1);
        Self::new(Relay::with_hook(upstream, hook).await)
    }
}

/// Whether `text` is a row-lock hold's parked batch.
fn row_lock_park(text: &str) -> bool {
    (text.contains("SLEEP(") || text.contains("GET_LOCK(")) && text.contains("wait_timeout")
}

/// Whether `text` is a lease waiter's park (not a release, which names the mark too).
fn lease_park(text: &str) -> bool {
    text.contains("lock-mysql park") && text.contains("'parked'")
}

/// The hook of [`Proxy::cutting_parks`], for one connection.
struct ParkCutter {
    /// Which batches are parks.
    park: fn(&str) -> bool,
    /// The OK of a park's answer after which the rest is cut.
    cut_after: usize,
    /// A parked batch was sent; its answer is being read.
    armed: bool,
    /// OK packets of that answer passed on so far.
    oks: usize,
    /// The rest of the answer is dropped.
    cutting: bool,
    /// A partial packet from the server.
    partial: Vec<u8>,
}

impl ParkCutter {
    fn new(park: fn(&str) -> bool, cut_after: usize) -> Self {
        Self {
            park,
            cut_after,
            armed: false,
            oks: 0,
            cutting: false,
            partial: Vec::new(),
        }
    }
}

impl Hook for ParkCutter {
    fn client_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        let text = String::from_utf8_lossy(bytes);
        if (self.park)(&text) {
            self.armed = true;
            self.oks = 0;
        }
        out.extend_from_slice(bytes);
        Flow::Forward
    }

    fn server_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        if !self.armed && self.partial.is_empty() {
            if !self.cutting {
                out.extend_from_slice(bytes);
            }
            return Flow::Forward;
        }
        self.partial.extend_from_slice(bytes);
        for packet in wire::packets(&mut self.partial) {
            if self.cutting {
                continue;
            }
            out.extend_from_slice(&packet);
            if !self.armed {
                continue;
            }
            match wire::ok_says_more(&packet) {
                Some(more) => {
                    self.oks += 1;
                    if self.oks == self.cut_after {
                        self.armed = false;
                        self.cutting = more;
                    }
                }
                // An error or a result set: not the parked batch's answer as expected.
                None => self.armed = false,
            }
        }
        Flow::Forward
    }
}

/// What a [`Proxy::cutting_after`] looks for: nothing until armed, and again nothing once it
/// cut a connection.
#[derive(Debug, Clone, Default)]
pub struct Needle(Arc<Mutex<Option<Vec<u8>>>>);

impl Needle {
    /// Cuts the next connection whose client sends `bytes`.
    pub fn arm(&self, bytes: &[u8]) {
        if let Ok(mut needle) = self.0.lock() {
            *needle = Some(bytes.to_vec());
        }
    }

    /// Whether it is still armed (no connection carried it since).
    pub fn armed(&self) -> bool {
        self.0.lock().is_ok_and(|needle| needle.is_some())
    }
}

/// The hook of one connection of a [`Proxy::cutting_after`].
struct NeedleCutter(Needle);

impl Hook for NeedleCutter {
    fn client_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        out.extend_from_slice(bytes);
        let Ok(mut needle) = (self.0).0.lock() else {
            return Flow::Forward;
        };
        let found = needle
            .as_deref()
            .is_some_and(|wanted| bytes.windows(wanted.len()).any(|w| w == wanted));
        if found {
            *needle = None;
            Flow::Cut
        } else {
            Flow::Forward
        }
    }
}
