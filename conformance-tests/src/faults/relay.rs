//! A TCP relay between a client and its server, for faults on the wire: it can watch the
//! traffic, cut a connection at a chosen message, drop everything while keeping the sockets
//! open (a half-open connection), accept connections and never answer them, slow every
//! message down, hold the link for a while as a network partition does, or close every
//! connection at once.
//!
//! The relay knows no protocol. A backend's test that needs to see messages gives it a
//! [`Hook`] that splits the bytes into its own frames.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, copy, sink},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::{JoinHandle, JoinSet},
};

use crate::{Failure, faults::fail};

/// What a relayed connection does after a [`Hook`] has seen some bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Flow {
    /// Passes on what the hook put out and goes on.
    Forward,
    /// Passes on what the hook put out, then closes both sides of the connection at once.
    Cut,
}

/// Sees and decides what one relayed connection carries, one direction at a time. The
/// relay makes one hook per connection, so a hook may keep the connection's state (a partial
/// frame, a request it waits for the answer to). By default every byte passes.
pub trait Hook: Send + 'static {
    /// `bytes` came from the client; push into `out` what the server gets now.
    fn client_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        out.extend_from_slice(bytes);
        Flow::Forward
    }

    /// `bytes` came from the server; push into `out` what the client gets now.
    fn server_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        out.extend_from_slice(bytes);
        Flow::Forward
    }
}

/// The hook of a relay that only forwards.
struct Plain;

impl Hook for Plain {}

type MakeHook = Arc<dyn Fn() -> Box<dyn Hook> + Send + Sync>;

/// The state of the link a relay plays, which its connections follow as it changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Link {
    /// How long each piece waits before it is passed on.
    delay: Duration,
    /// Partitioned: nothing is read or passed on, and no connection is made upstream.
    held: bool,
    /// How many times every connection was closed at once; a connection made before the
    /// latest of those ends.
    cuts: u64,
}

/// What the test changes while the relay runs.
#[derive(Debug)]
struct Controls {
    /// Nothing is forwarded any more, either way; sockets stay open.
    dark: AtomicBool,
    /// Connections after this many in all are stalled.
    forwarded: AtomicUsize,
    /// The link's delay, partition and cuts.
    link: watch::Sender<Link>,
}

/// A running relay to one server; dropping it closes every connection it accepted.
///
/// ```
/// # conformance_tests::runtime().unwrap().block_on(async {
/// use conformance_tests::faults::Relay;
/// use tokio::{io::{AsyncReadExt, AsyncWriteExt}, net::{TcpListener, TcpStream}};
///
/// // A server that answers `pong` to anything.
/// let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
/// let upstream = server.local_addr().unwrap();
/// tokio::spawn(async move {
///     while let Ok((mut conn, _)) = server.accept().await {
///         let mut buf = [0u8; 4];
///         if conn.read_exact(&mut buf).await.is_ok() {
///             let _ = conn.write_all(b"pong").await;
///         }
///     }
/// });
/// let relay = Relay::start(upstream).await.unwrap();
/// let mut client = TcpStream::connect(relay.addr()).await.unwrap();
/// client.write_all(b"ping").await.unwrap();
/// let mut answer = [0u8; 4];
/// client.read_exact(&mut answer).await.unwrap();
/// assert_eq!(&answer, b"pong");
/// # });
/// ```
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    controls: Arc<Controls>,
    task: JoinHandle<()>,
}

impl Relay {
    /// A relay to `upstream` that forwards everything.
    ///
    /// # Errors
    /// When it cannot listen on a local port.
    pub async fn start(upstream: SocketAddr) -> Result<Self, Failure> {
        Self::with_hook(upstream, || Plain).await
    }

    /// A relay to `upstream` whose connections each pass through a hook made by `make`.
    ///
    /// # Errors
    /// When it cannot listen on a local port.
    pub async fn with_hook<H: Hook>(
        upstream: SocketAddr,
        make: impl Fn() -> H + Send + Sync + 'static,
    ) -> Result<Self, Failure> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(fail("relay: listening"))?;
        let addr = listener.local_addr().map_err(fail("relay: address"))?;
        let controls = Arc::new(Controls {
            dark: AtomicBool::new(false),
            forwarded: AtomicUsize::new(usize::MAX),
            link: watch::Sender::new(Link::default()),
        });
        let make: MakeHook = Arc::new(move || Box::new(make()));
        let task = tokio::spawn(accept(listener, upstream, make, controls.clone()));
        Ok(Self {
            addr,
            controls,
            task,
        })
    }

    /// Where clients connect instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From the connection after the first `forwarded` on (counted from the start), each one
    /// is stalled: accepted, and what it sends read, but nothing forwarded and nothing
    /// answered, as a server host that died or a NAT that lost its mapping leaves it.
    pub fn stall_after(&self, forwarded: usize) {
        self.controls.forwarded.store(forwarded, Ordering::SeqCst);
    }

    /// From now on nothing is forwarded, either way, on any connection: bytes read are
    /// dropped, and no side learns that the other closed (a half-open connection).
    pub fn blackhole(&self) {
        self.controls.dark.store(true, Ordering::SeqCst);
    }

    /// From now on every piece of traffic, either way, waits `delay` before it is passed on
    /// (`Duration::ZERO`: no delay). A request and its answer each wait, so a round trip
    /// takes about twice `delay` more.
    pub fn delay(&self, delay: Duration) {
        self.controls.link.send_modify(|link| link.delay = delay);
    }

    /// Partitions the link (`true`) or heals it (`false`). While it is partitioned nothing is
    /// read or passed on, either way, and no side learns anything (no reset, no close): a
    /// half-open connection, as a cable pulled or a firewall dropping packets leaves it.
    /// What was sent meanwhile waits in the sockets and flows on once the link heals, as TCP
    /// delivers it after a partition; connections accepted meanwhile reach the server then.
    pub fn partition(&self, held: bool) {
        self.controls.link.send_modify(|link| link.held = held);
    }

    /// Closes every connection the relay carries now, both sides at once (a link that
    /// dropped, a proxy that restarted); later connections pass as before.
    pub fn cut_all(&self) {
        self.controls.link.send_modify(|link| link.cuts += 1);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    make: MakeHook,
    controls: Arc<Controls>,
) {
    // Owned here, so aborting this task ends every connection.
    let mut connections = JoinSet::new();
    let mut accepted = 0;
    while let Ok((mut inbound, _)) = listener.accept().await {
        accepted += 1;
        if accepted > controls.forwarded.load(Ordering::SeqCst) {
            connections.spawn(async move {
                let _ = copy(&mut inbound, &mut sink()).await;
            });
            continue;
        }
        let (hook, controls) = (make(), controls.clone());
        connections.spawn(async move {
            let mut link = controls.link.subscribe();
            let cuts = link.borrow().cuts;
            // Across a partition the connection reaches the server once it heals (or ends
            // with a cut, or with the relay).
            if link
                .wait_for(|now| !now.held || now.cuts != cuts)
                .await
                .is_err()
                || link.borrow().cuts != cuts
            {
                return;
            }
            // A server that does not answer: the client's connection is closed.
            if let Ok(outbound) = TcpStream::connect(upstream).await {
                relay(inbound, outbound, hook, &controls, link).await;
            }
        });
        // Finished connections' results are not needed.
        while connections.try_join_next().is_some() {}
    }
}

/// One side of a relayed connection: whether it still sends, and its read buffer.
struct Side {
    open: bool,
    buf: Vec<u8>,
}

impl Side {
    fn new() -> Self {
        Self {
            open: true,
            buf: vec![0; 64 * 1024],
        }
    }
}

/// Relays one connection until both sides closed, the hook cuts it, or every connection is
/// cut.
async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    mut hook: Box<dyn Hook>,
    controls: &Controls,
    mut link: watch::Receiver<Link>,
) {
    let (mut client_read, mut client_write) = inbound.into_split();
    let (mut server_read, mut server_write) = outbound.into_split();
    let (mut client, mut server) = (Side::new(), Side::new());
    let mut out = Vec::new();
    let cuts = link.borrow().cuts;
    while client.open || server.open {
        let now = *link.borrow_and_update();
        if now.cuts != cuts {
            // Dropping the sockets closes both sides.
            return;
        }
        let (read, from_client) = tokio::select! {
            changed = link.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            read = client_read.read(&mut client.buf), if client.open && !now.held => (read, true),
            read = server_read.read(&mut server.buf), if server.open && !now.held => (read, false),
        };
        let (side, to) = if from_client {
            (&mut client, &mut server_write)
        } else {
            (&mut server, &mut client_write)
        };
        let dark = controls.dark.load(Ordering::SeqCst);
        let n = match read {
            Ok(n) if n > 0 => n,
            _ => {
                side.open = false;
                if !dark {
                    let _ = to.shutdown().await;
                }
                continue;
            }
        };
        if dark {
            continue;
        }
        out.clear();
        let flow = if from_client {
            hook.client_sent(&side.buf[..n], &mut out)
        } else {
            hook.server_sent(&side.buf[..n], &mut out)
        };
        if !now.delay.is_zero() {
            tokio::time::sleep(now.delay).await;
        }
        if !out.is_empty() && to.write_all(&out).await.is_err() {
            return;
        }
        if flow == Flow::Cut {
            return;
        }
    }
    if controls.dark.load(Ordering::SeqCst) {
        // Half-open: neither side learns that the other one ended.
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::{TcpListener, TcpStream},
    };

    use super::Relay;

    /// An echo server's address.
    async fn echo() -> std::net::SocketAddr {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = server.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(client: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        client.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        client.read_exact(&mut answer).await?;
        Ok(answer)
    }

    #[tokio::test]
    async fn a_delay_slows_each_way() {
        let relay = Relay::start(echo().await).await.unwrap();
        let mut client = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut client).await.unwrap(), b"ping");
        relay.delay(Duration::from_millis(40));
        let start = Instant::now();
        assert_eq!(&round_trip(&mut client).await.unwrap(), b"ping");
        assert!(
            start.elapsed() >= Duration::from_millis(80),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn a_partition_holds_traffic_until_it_heals() {
        let relay = Relay::start(echo().await).await.unwrap();
        let mut client = TcpStream::connect(relay.addr()).await.unwrap();
        relay.partition(true);
        client.write_all(b"ping").await.unwrap();
        let mut answer = [0u8; 4];
        let held =
            tokio::time::timeout(Duration::from_millis(200), client.read_exact(&mut answer)).await;
        assert!(held.is_err(), "an answer crossed the partition: {held:?}");
        // A connection made during the partition waits too.
        let mut late = TcpStream::connect(relay.addr()).await.unwrap();
        late.write_all(b"pong").await.unwrap();
        relay.partition(false);
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ping");
        late.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"pong");
    }

    #[tokio::test]
    async fn a_cut_closes_every_connection_and_later_ones_pass() {
        let relay = Relay::start(echo().await).await.unwrap();
        let mut first = TcpStream::connect(relay.addr()).await.unwrap();
        let mut second = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut first).await.unwrap(), b"ping");
        assert_eq!(&round_trip(&mut second).await.unwrap(), b"ping");
        relay.cut_all();
        for client in [&mut first, &mut second] {
            let mut buf = [0u8; 4];
            let read = client.read(&mut buf).await;
            assert!(matches!(read, Ok(0) | Err(_)), "still open: {read:?}");
        }
        let mut after = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut after).await.unwrap(), b"ping");
    }
}
