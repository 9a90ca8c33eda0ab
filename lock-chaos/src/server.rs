//! The fenced resource as a service on loopback, for worker processes: one line per write,
//! `<fence> <worker> <name>`, answered `1` (accepted) or `0` (rejected).

use std::{net::SocketAddr, sync::Arc};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

use crate::{Resource, clock};

/// Serves `resource` on a free loopback port until the runtime shuts down; its address.
///
/// # Errors
/// When no port can be bound.
pub async fn serve(resource: Arc<Resource>) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("binding the resource's port: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(connection(stream, resource.clone()));
        }
    });
    Ok(addr)
}

async fn connection(stream: TcpStream, resource: Arc<Resource>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let at = clock::now();
        let mut parts = line.splitn(3, ' ');
        let (Some(fence), Some(worker), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let (Ok(fence), Ok(worker)) = (fence.parse::<u64>(), worker.parse::<u32>()) else {
            return;
        };
        let answer = if resource.write(name, fence, worker, at) {
            b"1\n"
        } else {
            b"0\n"
        };
        if write.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// A worker's connection to the resource.
#[derive(Debug)]
pub struct Writer {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Writer {
    /// Connects to the resource at `addr`.
    ///
    /// # Errors
    /// When it does not answer.
    pub async fn connect(addr: &str) -> Result<Self, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to the resource at {addr}: {e}"))?;
        let (read, write) = stream.into_split();
        Ok(Self {
            lines: BufReader::new(read).lines(),
            write,
        })
    }

    /// Writes under `name` with `fence` as `worker`; whether the resource accepted it.
    ///
    /// # Errors
    /// When the resource went away.
    pub async fn write(&mut self, name: &str, fence: u64, worker: u32) -> Result<bool, String> {
        self.write
            .write_all(format!("{fence} {worker} {name}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        match self.lines.next_line().await.map_err(|e| e.to_string())? {
            Some(answer) => Ok(answer == "1"),
            None => Err("the resource closed the connection".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_worker_writes_through_the_service() {
        let resource = Arc::new(Resource::new(true));
        let addr = serve(resource.clone()).await.unwrap();
        let mut writer = Writer::connect(&addr.to_string()).await.unwrap();
        assert!(writer.write("a/b c", 2, 1).await.unwrap());
        assert!(!writer.write("a/b c", 1, 2).await.unwrap());
        let log = resource.log();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].name, "a/b c");
    }
}
