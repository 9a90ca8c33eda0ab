//! A TCP relay between a client and its server, for faults on the wire: it can watch the
//! traffic, cut a connection at a chosen message, drop everything while keeping the sockets
//! open (a half-open connection), or accept connections and never answer them.
//!
//! The relay knows no protocol. A backend's test that needs to see messages gives it a
//! [`Hook`] that splits the bytes into its own frames.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, copy, sink},
    net::{TcpListener, TcpStream},
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

/// What the test changes while the relay runs.
#[derive(Debug)]
struct Controls {
    /// Nothing is forwarded any more, either way; sockets stay open.
    dark: AtomicBool,
    /// Connections after this many in all are stalled.
    forwarded: AtomicUsize,
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
            // A server that does not answer: the client's connection is closed.
            if let Ok(outbound) = TcpStream::connect(upstream).await {
                relay(inbound, outbound, hook, &controls).await;
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

/// Relays one connection until both sides closed, or the hook cuts it.
async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    mut hook: Box<dyn Hook>,
    controls: &Controls,
) {
    let (mut client_read, mut client_write) = inbound.into_split();
    let (mut server_read, mut server_write) = outbound.into_split();
    let (mut client, mut server) = (Side::new(), Side::new());
    let mut out = Vec::new();
    while client.open || server.open {
        let (read, from_client) = tokio::select! {
            read = client_read.read(&mut client.buf), if client.open => (read, true),
            read = server_read.read(&mut server.buf), if server.open => (read, false),
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
