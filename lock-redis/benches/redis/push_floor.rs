//! The raw floor of a hand-off by push between two clients: what a release that wakes a waiter
//! of another client cannot beat on this machine, without any code of this library.

use std::{
    sync::mpsc,
    time::{Duration, Instant},
};

use conformance_tests::bench::{self, Stats};
use futures::StreamExt;

/// How many messages the floor times (after a tenth as many to warm up).
const SAMPLES: usize = 2_000;

/// The channel the floor publishes on (its own, so no lock client hears it).
const CHANNEL: &str = "bench:push-floor";

/// Times a raw hand-off by push on the server at `url`: one thread (its own current-thread
/// runtime and connection) sends a script that deletes a key and publishes a message, as a
/// release does; another thread (its own runtime and pub/sub connection, as another client's
/// waiter has) hears it. Each sample is from the send to the hearing, 1 ms apart (the fleets'
/// hold). The two threads stand for two processes: the hand-off between separate clients
/// crosses the same wake-up of another thread.
///
/// # Errors
/// A failed connection, subscription or call, or a lost message.
pub(crate) fn push_floor(url: &str) -> Result<Stats, String> {
    let samples = conformance_tests::selection::scaled(SAMPLES);
    let warm_up = samples / 10;
    let total = warm_up + samples;
    let (ready_tx, ready_rx) = mpsc::channel();
    let listener_url = url.to_owned();
    let listener = std::thread::spawn(move || -> Result<Vec<Instant>, String> {
        runtime()?.block_on(async move {
            let client = redis::Client::open(listener_url.as_str()).map_err(|e| e.to_string())?;
            let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
            pubsub.subscribe(CHANNEL).await.map_err(|e| e.to_string())?;
            ready_tx.send(()).map_err(|e| e.to_string())?;
            let mut messages = pubsub.on_message();
            let mut heard = Vec::with_capacity(total);
            while heard.len() < total {
                let message = tokio::time::timeout(Duration::from_secs(5), messages.next())
                    .await
                    .map_err(|_| "a push-floor message was not heard within 5 s".to_owned())?
                    .ok_or("the push floor's subscription ended")?;
                heard.push(Instant::now());
                drop(message);
            }
            Ok(heard)
        })
    });
    ready_rx
        .recv()
        .map_err(|_| "the push floor's listener did not subscribe".to_owned())?;
    let sent = runtime()?.block_on(async {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let release = redis::Script::new(
            "redis.call('DEL', KEYS[1]) return redis.call('PUBLISH', ARGV[1], ARGV[2])",
        );
        let mut sent = Vec::with_capacity(total);
        for i in 0..total {
            tokio::time::sleep(Duration::from_millis(1)).await;
            sent.push(Instant::now());
            let _: i64 = release
                .key("bench:push-floor:key")
                .arg(CHANNEL)
                .arg(i)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok::<_, String>(sent)
    })?;
    let heard = listener
        .join()
        .map_err(|_| "the push floor's listener panicked".to_owned())??;
    let delays: Vec<Duration> = sent
        .iter()
        .zip(&heard)
        .skip(warm_up)
        .map(|(sent, heard)| heard.saturating_duration_since(*sent))
        .collect();
    bench::stats_of(&delays)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}
