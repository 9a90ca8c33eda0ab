//! A TCP proxy in front of the test server that can blackhole its connections: after
//! [`Proxy::blackhole`] nothing more is forwarded either way and the sockets stay open, as on a
//! half-open connection (a peer gone without a reset, a firewall dropping packets).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// A running proxy.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    dark: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts a proxy to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let dark = Arc::new(AtomicBool::new(false));
        let flag = dark.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (client_rx, client_tx) = client.into_split();
                let (server_rx, server_tx) = server.into_split();
                tokio::spawn(pump(client_rx, server_tx, flag.clone()));
                tokio::spawn(pump(server_rx, client_tx, flag.clone()));
            }
        });
        Ok(Self { addr, dark })
    }

    /// From now on, nothing is forwarded (bytes read are dropped); connections stay open.
    pub fn blackhole(&self) {
        self.dark.store(true, Ordering::SeqCst);
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

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    dark: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if dark.load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    if !dark.load(Ordering::SeqCst) {
        let _ = to.shutdown().await;
    } else {
        // Half-open: the other side never learns that this one ended.
        std::future::pending::<()>().await;
    }
}
