//! The ZooKeeper servers of `cargo xtask services` as the cases see them: the service
//! instance (stopped and paused through the fault kit), its client port, and what it says to
//! four-letter words (its mode, its sessions).

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome,
    faults::{Instance, Stopped, poll_until},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// One server: its service instance and client port.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    pub(crate) instance: Instance,
    pub(crate) port: u16,
}

impl Server {
    /// The server of the service instance `name`, its port read from its `zoo.cfg`.
    pub(crate) fn named(name: &str) -> Result<Self, Failure> {
        let instance = Instance::named(name)?;
        let dir = instance.dir();
        let config = std::fs::read_to_string(dir.join("zoo.cfg"))
            .map_err(|e| Failure(format!("reading {}/zoo.cfg: {e}", dir.display())))?;
        let port = config
            .lines()
            .find_map(|l| l.strip_prefix("clientPort="))
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| Failure(format!("no clientPort in {}/zoo.cfg", dir.display())))?;
        Ok(Self { instance, port })
    }

    /// The three nodes of the ensemble.
    pub(crate) fn ensemble() -> Result<Vec<Self>, Failure> {
        (1..=3)
            .map(|i| Self::named(&format!("zk-ensemble-{i}")))
            .collect()
    }

    /// The answer to a four-letter word, or `None` when the server does not answer in 2 s.
    pub(crate) async fn four_letters(&self, word: &str) -> Option<String> {
        let ask = async {
            let mut stream = TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
            stream.write_all(word.as_bytes()).await.ok()?;
            let mut out = String::new();
            stream.read_to_string(&mut out).await.ok()?;
            Some(out)
        };
        tokio::time::timeout(Duration::from_secs(2), ask)
            .await
            .ok()
            .flatten()
    }

    /// `leader`, `follower`, `standalone`, or `None` when not serving.
    pub(crate) async fn mode(&self) -> Option<String> {
        let out = self.four_letters("srvr").await?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    }

    /// Whether a session with this id is connected to this server.
    pub(crate) async fn serves_session(&self, session: i64) -> bool {
        let needle = format!("sid=0x{session:x}");
        self.four_letters("cons")
            .await
            .is_some_and(|out| out.contains(&needle))
    }

    /// Starts the server `stopped` holds again and waits until it serves.
    pub(crate) async fn start_again(&self, stopped: Stopped) -> Outcome {
        stopped.start().await?;
        poll_until(
            Duration::from_secs(30),
            "the restarted node serving",
            async || Ok(self.mode().await.is_some()),
        )
        .await
    }
}

/// The index of a server of `servers` that is a follower now.
pub(crate) async fn follower_of(servers: &[Server]) -> Result<usize, Failure> {
    for (i, server) in servers.iter().enumerate() {
        if server.mode().await.as_deref() == Some("follower") {
            return Ok(i);
        }
    }
    Err(Failure("no follower in the ensemble".into()))
}

/// The server of `servers` that is the leader now.
pub(crate) async fn leader_of(servers: &[Server]) -> Option<&Server> {
    for server in servers {
        if server.mode().await.as_deref() == Some("leader") {
            return Some(server);
        }
    }
    None
}
