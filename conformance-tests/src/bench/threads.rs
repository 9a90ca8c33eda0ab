//! Separate clients as separate processes would have them: each an OS thread with its own
//! current-thread runtime and its own client, all connected before the clock starts.

use std::{
    sync::{
        Arc, Barrier, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

/// Runs `clients` threads: thread `i` makes its client with `connect(i)` on a runtime of its
/// own, waits until every thread has one, then runs `body(i, client, began)` on that
/// runtime, `began` being the instant the main thread started the clock (after every client
/// connected). On the calling thread, `during(began)` runs while the clients do. Blocks until
/// every thread has ended; returns `began`.
///
/// # Errors
/// The first error of a thread (connecting or its body), as text.
pub fn run_clients<T, C, CF, B, BF>(
    clients: usize,
    connect: C,
    body: B,
    during: impl FnOnce(Instant),
) -> Result<Instant, String>
where
    C: Fn(usize) -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<T, String>>,
    B: Fn(usize, T, Instant) -> BF + Send + Sync + 'static,
    BF: Future<Output = Result<(), String>>,
{
    let (connect, body) = (Arc::new(connect), Arc::new(body));
    // Every client connects first; the clock starts when all are ready (the start is set
    // between the two barriers: set before the first, it would run while slow clients still
    // connect, and a run of a thousand clients would be cut short).
    let ready = Arc::new(Barrier::new(clients + 1));
    let go = Arc::new(Barrier::new(clients + 1));
    let start = Arc::new(Mutex::new(None::<Instant>));
    let mut threads = Vec::with_capacity(clients);
    for id in 0..clients {
        let (connect, body) = (connect.clone(), body.clone());
        let (ready, go, start) = (ready.clone(), go.clone(), start.clone());
        let thread = std::thread::Builder::new()
            .name(format!("client-{id}"))
            .spawn(move || -> Result<(), String> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string());
                let client = runtime
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(|rt| rt.block_on(connect(id)));
                ready.wait();
                go.wait();
                let (runtime, client) = (runtime?, client?);
                let began = start
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .ok_or("the run did not start")?;
                runtime.block_on(body(id, client, began))
            })
            .map_err(|e| e.to_string())?;
        threads.push(thread);
    }
    ready.wait();
    let began = Instant::now();
    *start.lock().unwrap_or_else(PoisonError::into_inner) = Some(began);
    go.wait();
    during(began);
    let mut first_error = None;
    for thread in threads {
        let outcome = thread
            .join()
            .map_err(|_| "a client thread panicked".to_string())
            .and_then(|r| r);
        if let Err(error) = outcome {
            first_error.get_or_insert(error);
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(began),
    }
}

/// [`run_clients`] for clients that count something (the acquisitions of a raw floor): thread
/// `i` makes its client with `connect(i)`, then `body(i, client, began)` returns its count.
/// Returns the sum of the counts.
///
/// # Errors
/// The first error of a thread (connecting or its body), as text.
pub fn run_counting<T, C, CF, B, BF>(clients: usize, connect: C, body: B) -> Result<usize, String>
where
    C: Fn(usize) -> CF + Send + Sync + 'static,
    CF: Future<Output = Result<T, String>>,
    B: Fn(usize, T, Instant) -> BF + Send + Sync + 'static,
    BF: Future<Output = Result<usize, String>>,
{
    let total = Arc::new(AtomicUsize::new(0));
    let counted = total.clone();
    let body = Arc::new(body);
    run_clients(
        clients,
        connect,
        move |id, client, began| {
            let (counted, body) = (counted.clone(), body.clone());
            async move {
                let count = body(id, client, began).await?;
                counted.fetch_add(count, Ordering::Relaxed);
                Ok(())
            }
        },
        |_| {},
    )?;
    Ok(total.load(Ordering::Relaxed))
}
