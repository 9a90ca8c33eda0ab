//! The raw floors of a hand-off by push between clients, without any code of this library: the
//! time from a release to another client hearing it ([`push_floor`]), and the rate of clients
//! that pass the lock round-robin by push ([`ring`]).

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

/// The rate of a fair hand-off by push with nothing else around it: `clients` separate clients
/// (each an OS thread with its own current-thread runtime, a connection, and a pub/sub
/// connection on a channel of its own; see [`bench::run_counting`]) pass one turn round-robin
/// for `run_for`. The client whose turn it is counts an acquisition, holds `hold`
/// (`tokio::time::sleep`, as the fleets hold) and hands the turn to the next by the release
/// script of [`push_floor`] (a `DEL` of a key nobody writes, and a `PUBLISH` on the next
/// client's channel); the next one holds as soon as it hears it. No lock is taken, and each
/// turn goes to the client that waited longest. Returns the acquisitions begun within
/// `run_for` per second of `run_for`. (A fleet divides its count by the whole run, to the end
/// of its last turns, a little longer: its rate against this one leans, if at all, against
/// this library.)
///
/// # Errors
/// A failed connection, subscription or call, or a turn not heard within 5 s.
pub(crate) fn ring(
    url: &str,
    clients: usize,
    hold: Duration,
    run_for: Duration,
) -> Result<f64, String> {
    let run_for = conformance_tests::selection::run_for(run_for);
    let (url, stem) = (
        url.to_owned(),
        format!("bench:ring:{:016x}", rand::random::<u64>()),
    );
    let taken = bench::run_counting(
        clients,
        move |id| {
            let (url, stem) = (url.clone(), stem.clone());
            async move { Seat::new(&url, &stem, (id, clients)).await }
        },
        move |_, seat, began| seat.run(hold, began + run_for),
    )?;
    Ok(taken as f64 / run_for.as_secs_f64())
}

/// One client of the [`ring`].
struct Seat {
    /// Its place in the ring (0 has the first turn).
    id: usize,
    /// The connection it publishes on.
    conn: redis::aio::MultiplexedConnection,
    /// Its subscription to its own channel.
    pubsub: redis::aio::PubSub,
    /// The next client's channel.
    next: String,
}

impl Seat {
    /// Connects client `id` of `clients` to `url` and subscribes it to its channel
    /// (`<stem>:<id>`).
    async fn new(url: &str, stem: &str, (id, clients): (usize, usize)) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
        pubsub
            .subscribe(format!("{stem}:{id}"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            id,
            conn,
            pubsub,
            next: format!("{stem}:{}", (id + 1) % clients),
        })
    }

    /// Takes its turns until `end`; returns how many it began before `end`. Once the run is
    /// over, each client passes the turn on once more and stops, so every one hears the end.
    async fn run(mut self, hold: Duration, end: Instant) -> Result<usize, String> {
        let release = redis::Script::new(
            "redis.call('DEL', KEYS[1]) return redis.call('PUBLISH', ARGV[1], ARGV[2])",
        );
        let key = format!("{}:key", self.next);
        let mut messages = self.pubsub.on_message();
        let mut taken = 0;
        // The first client has the first turn.
        let mut turn = self.id == 0;
        loop {
            if !turn {
                tokio::time::timeout(Duration::from_secs(5), messages.next())
                    .await
                    .map_err(|_| "a ring turn was not heard within 5 s".to_owned())?
                    .ok_or("a ring subscription ended")?;
            }
            turn = false;
            let over = Instant::now() >= end;
            if !over {
                taken += 1;
                tokio::time::sleep(hold).await;
            }
            let _: i64 = release
                .key(&key)
                .arg(&self.next)
                .arg(taken)
                .invoke_async(&mut self.conn)
                .await
                .map_err(|e| e.to_string())?;
            if over {
                return Ok(taken);
            }
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}
