//! A TCP proxy for fault cases: it forwards the first connections to the server and accepts,
//! but never answers, the ones after them: a half-open connection, as a NAT that dropped its
//! mapping or a server host that died without a reset leaves behind.

use conformance_tests::Failure;
use redis::{ConnectionAddr, IntoConnectionInfo};
use tokio::{
    io::{copy, copy_bidirectional, sink},
    net::{TcpListener, TcpStream},
    task::{JoinHandle, JoinSet},
};

use super::fail;

/// The proxy; dropping it closes every connection it accepted.
pub(super) struct Proxy {
    /// The URL to connect to instead of the server's.
    pub(super) url: String,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy in front of the server at `url` that forwards its first `forwarded` connections
    /// and blackholes the rest: it reads what they send and never writes a byte.
    pub(super) async fn start(url: &str, forwarded: usize) -> Result<Self, Failure> {
        let upstream = match url
            .into_connection_info()
            .map_err(fail("server URL"))?
            .addr()
        {
            ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => {
                return Err(Failure(format!(
                    "the proxy needs a TCP server, not {other:?}"
                )));
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(fail("proxy bind"))?;
        let addr = listener.local_addr().map_err(fail("proxy address"))?;
        let task = tokio::spawn(async move {
            // Owned here, so aborting the proxy's task ends every connection.
            let mut connections = JoinSet::new();
            let mut accepted = 0;
            while let Ok((mut inbound, _)) = listener.accept().await {
                accepted += 1;
                if accepted <= forwarded {
                    let upstream = upstream.clone();
                    connections.spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                            let _ = copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                } else {
                    connections.spawn(async move {
                        let _ = copy(&mut inbound, &mut sink()).await;
                    });
                }
            }
        });
        Ok(Self {
            url: format!("redis://{addr}"),
            task,
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
