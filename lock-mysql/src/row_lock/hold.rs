//! The owner of a row-lock hold's connection: a task that keeps a statement parked on it so the
//! connection closing is seen the moment it closes, and runs the hold's renewals and release.
//!
//! **Why park.** An idle connection tells the client nothing: after `KILL CONNECTION` (or a
//! server restart, or the server's idle limit) the hold is over on the server, the next holder
//! may be granted at once, and the old holder would learn it only at its next renewal. A
//! statement in flight, though, fails the moment its connection closes. So between commands
//! the task keeps a wait running on the connection, in chunks of at most [`PARK_CHUNK`]
//! (a `GET_LOCK` on the client's [anchor](crate::anchor), which `KILL QUERY` stops at once,
//! or where there is none a `SLEEP`), and
//! when a chunk fails with a lost connection it fires the hold's end signal
//! ([`EndNotifier::end`]): `is_held()` turns false before the server can grant the lock to
//! anyone else (the server closes the socket before it rolls the transaction back).
//!
//! **The whole lease is watched.** Chunks are parked up to the end of the lease
//! (`valid_from + ttl`), its last second included, whatever the TTL. (They once stopped a
//! second before it, so that the server's idle limit would end a frozen holder's hold at the
//! lease's end exactly; a lease of a TTL up to a second was then never parked, and neither
//! was any lease's last second: a holder whose connection was killed there kept
//! `is_held() == true` after the server had granted the lock to the next client. The fault
//! campaign found it as trusted overlaps; `hold_end`'s
//! `row_lock/killed_connection_seen_before_the_next_grant` has the TTLs that showed it.)
//!
//! **The server still ends a stopped holder's hold.** The server's idle limit
//! (`wait_timeout`) ends a hold whose client stopped: never before its local deadline, and at
//! most about a second after the lease's end:
//! - while a chunk runs the connection is not idle; between chunks (a few microseconds for a
//!   live client) `wait_timeout` is the TTL rounded up, so a client frozen there loses the hold
//!   no earlier than it would have without parking;
//! - the last chunk of a lease, when it runs to its end undisturbed (the lease was not
//!   renewed), sets `wait_timeout` to 1 s on the server (`SET SESSION wait_timeout =
//!   IF(SLEEP(..) = 0, 1, <ttl>)`; an interrupted sleep fails or returns 1 and keeps the TTL),
//!   so a holder that froze loses the hold one second (the server's idle limit counts whole
//!   seconds) after `valid_from + ttl` by the server's count, never earlier than the client's
//!   own deadline (the server started counting after the client sent the chunk). That second
//!   is the price of watching the last one: the lock is free that much later after a frozen
//!   holder, never earlier than it is safe. (On the anchor the chunk is `GET_LOCK(..) = 0`,
//!   its timeout, in place of `SLEEP(..) = 0`; a chunk that took the anchor gives it back in
//!   the same statement and keeps the TTL.)
//!
//! **Costs.** A renewal or the release first stops the parked chunk with `KILL QUERY` from the
//! anchor's connection, or when it is busy or down the one kept beside the pool (one round
//! trip more than an idle connection needs). A holder process that dies is noticed by the
//! server when its chunk ends (at most [`PARK_CHUNK`]), not at once as on an idle connection.
//! Each held lock runs one tiny statement per [`PARK_CHUNK`].
//!
//! **Clean-up.** When lock-core stops listening ([`EndNotifier::is_closed`]: the guard was
//! dropped without a runtime, or a release failed) the task rolls the hold back and forgets it,
//! at the latest one [`PARK_CHUNK`] later.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use lock_core::{
    LockError, LockName, LossReason,
    backend::{EndNotifier, LeaseToken},
};
use sqlx::AssertSqlSafe;
use tokio::sync::{mpsc, oneshot};

use super::{Shared, connections::Dedicated};
use crate::{
    anchor,
    error::{Class, Error, classify},
    sql::{is_timed_out, run, timed_out, within},
};

/// The longest one parked wait (`GET_LOCK` on the anchor, or `SLEEP`) runs: how long a dead
/// client's hold may outlive it on the server, and how often an idle hold costs a statement.
pub(super) const PARK_CHUNK: Duration = Duration::from_secs(1);

/// The server's idle limit after the last chunk of a lease that was not renewed.
const LAST_IDLE_SECS: u64 = 1;

/// A chunk that returns by itself in less than this share of its length (halves) ended early:
/// on the anchor, the task looks whether it took the anchor (see [`crate::anchor`]).
const EARLY: u32 = 2;

/// Chunks shorter than this are not worth parking.
const MIN_PARK: Duration = Duration::from_millis(20);

/// How long to wait for a killed chunk to answer before sending `KILL QUERY` again (a fallback:
/// the kill is sent once the server is inside the chunk's batch, where it is not lost).
const KILL_AGAIN: Duration = Duration::from_millis(20);

/// What the hold's owner is asked to do.
pub(super) enum Command {
    /// Confirm the hold and make it last `ttl` from now; answers the send time of the check.
    Renew {
        ttl: Duration,
        reply: oneshot::Sender<Result<Instant, LockError>>,
    },
    /// Roll back and end.
    Release {
        reply: oneshot::Sender<Result<(), LockError>>,
    },
}

/// The hold's facts the task needs.
pub(super) struct Hold {
    pub(super) name: LockName,
    pub(super) token: LeaseToken,
    /// The hold's lease began at `valid_from` (a send time) and lasts `ttl`.
    pub(super) valid_from: Instant,
    pub(super) ttl: Duration,
}

/// Starts the task owning `dedicated` for `hold`; the sender is the hold's handle (when every
/// sender is dropped, the task rolls the hold back and ends).
pub(super) fn spawn(
    shared: Arc<Shared>,
    hold: Hold,
    dedicated: Dedicated,
    notifier: EndNotifier,
) -> mpsc::Sender<Command> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(own(shared, hold, dedicated, notifier, rx));
    tx
}

/// How the connection ended its service.
enum End {
    /// It closed (or stopped answering): the hold is over on the server.
    Lost,
    /// Rolled back and given back (released, or nobody listens any more).
    Done,
}

/// What the owner does next, decided while the connection is parked (or idle).
enum Next {
    /// Run this command.
    Command(Command),
    /// Look again (a chunk ran to its end, or nothing came for a while).
    Again,
    /// Every handle was dropped: roll back and end.
    Finish,
    /// The connection failed (with the command that came meanwhile, if one did).
    Lost(sqlx::Error, Option<Command>),
}

async fn own(
    shared: Arc<Shared>,
    mut hold: Hold,
    mut dedicated: Dedicated,
    notifier: EndNotifier,
    mut rx: mpsc::Receiver<Command>,
) {
    let end = loop {
        if notifier.is_closed() {
            tracing::debug!(lock = %hold.name, "nobody holds the guard any more; rolling back");
            shared.forget(&hold.token);
            break finish(&shared, dedicated).await;
        }
        let command = match next(&shared, &hold, &mut dedicated, &mut rx).await {
            Next::Command(command) => command,
            Next::Again => continue,
            Next::Finish => break finish(&shared, dedicated).await,
            Next::Lost(error, command) => {
                let end = lost(&shared, &hold, dedicated, &notifier, &error);
                if let Some(command) = command {
                    answer_lost(command, &hold.name);
                }
                break end;
            }
        };
        match command {
            Command::Renew { ttl, reply } => {
                match renew(&shared, &hold.name, &hold.token, &mut dedicated, ttl).await {
                    Ok(sent) => {
                        hold.valid_from = sent;
                        hold.ttl = ttl;
                        let _ = reply.send(Ok(sent));
                    }
                    Err(Renewal::NotHeld) => {
                        // Cannot happen while the transaction lives; end the hold rather than
                        // trust it.
                        let _ = reply.send(Err(LockError::not_held(&hold.name)));
                        notifier.end(LossReason::NotHeld);
                        shared.forget(&hold.token);
                        shared.discard(dedicated);
                        break End::Lost;
                    }
                    Err(Renewal::Lost(error)) => {
                        let end = lost(&shared, &hold, dedicated, &notifier, &error);
                        let _ = reply.send(Err(session_ended(&hold.name)));
                        break end;
                    }
                    Err(Renewal::Failed(error)) => {
                        // The session may not have taken the new idle limit: set it again.
                        dedicated.wait_timeout = None;
                        let _ = reply.send(Err(LockError::from(Error::new(
                            format!("renewing `{}`", hold.name),
                            error,
                        ))));
                    }
                }
            }
            Command::Release { reply } => break release(&shared, &hold, dedicated, reply).await,
        }
    };
    if matches!(end, End::Lost) {
        // Anyone who asked meanwhile learns the hold is over.
        rx.close();
        while let Some(command) = rx.recv().await {
            answer_lost(command, &hold.name);
        }
    }
}

/// Parks a chunk until the next command (or the chunk's end), up to the end of the lease (a
/// remainder shorter than [`MIN_PARK`] joins the last chunk); once the lease is over, nothing
/// is parked: waits for a command, looking now and then whether anyone still listens.
async fn next(
    shared: &Arc<Shared>,
    hold: &Hold,
    dedicated: &mut Dedicated,
    rx: &mut mpsc::Receiver<Command>,
) -> Next {
    let left = (hold.valid_from + hold.ttl).saturating_duration_since(Instant::now());
    if left < MIN_PARK {
        return match tokio::time::timeout(PARK_CHUNK, rx.recv()).await {
            Ok(Some(command)) => Next::Command(command),
            Ok(None) => Next::Finish,
            Err(_) => Next::Again,
        };
    }
    let last = left <= PARK_CHUNK + MIN_PARK;
    let chunk = if last { left } else { PARK_CHUNK };
    park(shared, dedicated, rx, chunk, last).await
}

/// Runs one parked chunk of `chunk` on the connection until it ends or a command comes (then
/// stops it first). The `last` chunk of a lease leaves the server's idle limit at
/// [`LAST_IDLE_SECS`] when it runs to its end.
async fn park(
    shared: &Arc<Shared>,
    dedicated: &mut Dedicated,
    rx: &mut mpsc::Receiver<Command>,
    chunk: Duration,
    last: bool,
) -> Next {
    let big = dedicated.wait_timeout.unwrap_or(LAST_IDLE_SECS);
    let anchor = shared.anchor.name();
    // Move to the anchor soon once it is up.
    let (chunk, last) =
        if anchor.is_none() && shared.anchor.raising() && chunk > anchor::WHILE_RAISING {
            (anchor::WHILE_RAISING, false)
        } else {
            (chunk, last)
        };
    let seconds = format!("{}.{:06}", chunk.as_secs(), chunk.subsec_micros());
    // The wait, true when it ran to its end; and the idle limit when it did not.
    let (wait, stopped) = match &anchor {
        Some(name) => (
            format!(
                "({} := GET_LOCK('{name}', {seconds})) = 0",
                anchor::TOOK_VAR
            ),
            // Took the anchor (its connection ended): give it back at once.
            format!("{big} + 0 * COALESCE(RELEASE_LOCK('{name}'), 0)"),
        ),
        None => (format!("SLEEP({seconds}) = 0"), big.to_string()),
    };
    // `DO 0` first: its answer tells the client the server is inside the batch, where a
    // `KILL QUERY` stops the rest of it (one sent before the batch starts is lost). The
    // sleep and the idle limit are one statement, the batch's last: MariaDB looks for a kill
    // between the statements of a batch, and one found there ends the batch without the rest
    // of its answer though the answer before said more would follow, so the client would
    // wait until the server's idle limit closed the connection (fault case
    // `row_lock/park_killed_between_statements`). Killed inside its one statement, the sleep
    // ends early (or the statement fails with 1317), and the answer comes whole.
    let park = format!(
        "DO 0; SET SESSION wait_timeout = IF({wait}, {}, {stopped})",
        if last { LAST_IDLE_SECS } else { big },
    );
    if last {
        // Whether the chunk runs to its end (and leaves the server's idle limit at
        // `LAST_IDLE_SECS`) is not known when a command stops it just then: count on the
        // shorter limit, so the next renewal sets the TTL's again.
        dedicated.wait_timeout = Some(LAST_IDLE_SECS);
    }
    let id = dedicated.id;
    let sent = Instant::now();
    let (started_tx, started) = oneshot::channel();
    let conn = &mut dedicated.conn;
    let mut parked = Box::pin(async move {
        let mut answers = sqlx::raw_sql(AssertSqlSafe(park)).execute_many(conn);
        let mut started_tx = Some(started_tx);
        while let Some(answer) = answers.next().await {
            answer?;
            if let Some(tx) = started_tx.take() {
                let _ = tx.send(());
            }
        }
        Ok::<_, sqlx::Error>(())
    });
    let early = tokio::select! {
        result = &mut parked => match result {
            Ok(()) => sent.elapsed() * EARLY < chunk,
            // Stopped by a kill nobody here sent: the connection (and the hold) lives on.
            Err(error) if classify(&error) == Class::Interrupted => false,
            Err(error) => return Next::Lost(error, None),
        },
        command = rx.recv() => {
            // Stop the chunk before using the connection.
            let until = Instant::now() + shared.statement_timeout;
            return match unpark(shared, id, parked.as_mut(), started, until).await {
                Ok(()) => command.map_or(Next::Finish, Next::Command),
                Err(error) => Next::Lost(error, command),
            };
        }
    };
    drop(parked);
    match anchor {
        Some(name) if early => took_anchor(shared, dedicated, &name).await,
        _ => Next::Again,
    }
}

/// A chunk on the anchor `name` ended early by itself: if it took the anchor (its connection
/// ended), reports the anchor lost, so the next chunks park in `SLEEP` until a new one is up.
async fn took_anchor(shared: &Shared, dedicated: &mut Dedicated, name: &str) -> Next {
    let until = Instant::now() + shared.statement_timeout;
    let read =
        sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(format!("SELECT {}", anchor::TOOK_VAR)))
            .fetch_one(&mut dedicated.conn);
    match within(until, read).await {
        Ok(Some(1)) => {
            shared.anchor.lost(name);
            Next::Again
        }
        Ok(_) => Next::Again,
        Err(error) if classify(&error) == Class::Connection => Next::Lost(error, None),
        // Anything else says nothing about the hold; the next chunk looks again.
        Err(_) => Next::Again,
    }
}

/// Rolls the hold back for a release and gives the connection back (or closes it).
async fn release(
    shared: &Shared,
    hold: &Hold,
    mut dedicated: Dedicated,
    reply: oneshot::Sender<Result<(), LockError>>,
) -> End {
    shared.forget(&hold.token);
    let until = Instant::now() + shared.statement_timeout;
    let answer = match within(until, run(&mut dedicated.conn, "ROLLBACK")).await {
        Ok(_) => {
            shared.keep(dedicated);
            Ok(())
        }
        Err(error) => {
            shared.discard(dedicated);
            Err(release_error(&hold.name, error))
        }
    };
    let _ = reply.send(answer);
    End::Done
}

/// The hold's connection failed with `error`: the hold is over (or cannot be trusted: a
/// connection left mid-statement is closed). Fires the end signal and forgets the hold.
fn lost(
    shared: &Shared,
    hold: &Hold,
    dedicated: Dedicated,
    notifier: &EndNotifier,
    error: &sqlx::Error,
) -> End {
    tracing::debug!(lock = %hold.name, %error, "the connection holding the lock ended");
    notifier.end(LossReason::SessionEnded);
    shared.forget(&hold.token);
    shared.discard(dedicated);
    End::Lost
}

/// Rolls the hold back and gives the connection back (or closes it).
async fn finish(shared: &Shared, dedicated: Dedicated) -> End {
    shared.rollback_and_keep(dedicated).await;
    End::Done
}

fn session_ended(name: &LockName) -> LockError {
    LockError::lost(name.to_string(), LossReason::SessionEnded)
}

fn answer_lost(command: Command, name: &LockName) {
    match command {
        Command::Renew { reply, .. } => {
            let _ = reply.send(Err(session_ended(name)));
        }
        Command::Release { reply } => {
            let _ = reply.send(Err(session_ended(name)));
        }
    }
}

/// The error of a failed `ROLLBACK` (the connection has been closed, which ends the hold on the
/// server once it notices).
fn release_error(name: &LockName, error: sqlx::Error) -> LockError {
    if is_timed_out(&error) {
        LockError::Unavailable {
            message: format!(
                "releasing `{name}`: no answer in time; the connection was closed, so the server \
                 ends the hold when it notices (at the latest after its idle limit, the TTL)"
            ),
            source: Some(Box::new(error)),
        }
    } else if classify(&error) == Class::Connection {
        // The connection, and with it the hold, had already ended.
        session_ended(name)
    } else {
        LockError::from(Error::new(format!("releasing `{name}`"), error))
    }
}

/// Stops the parked chunk and waits for its answer: once the server is inside the chunk's
/// batch (`started`), `KILL QUERY`, again while it keeps running. A chunk that ended by itself
/// or was interrupted is fine; a lost connection, or no answer by `until`, is the error.
async fn unpark<F>(
    shared: &Shared,
    id: u64,
    mut parked: std::pin::Pin<&mut F>,
    started: oneshot::Receiver<()>,
    until: Instant,
) -> Result<(), sqlx::Error>
where
    F: std::future::Future<Output = Result<(), sqlx::Error>>,
{
    let outcome = |result: Result<(), sqlx::Error>| match result {
        Ok(()) => Ok(()),
        Err(error) if classify(&error) == Class::Interrupted => Ok(()),
        Err(error) => Err(error),
    };
    tokio::select! {
        result = parked.as_mut() => return outcome(result),
        _ = started => {}
        () = tokio::time::sleep_until(until.into()) => return Err(timed_out()),
    }
    loop {
        if Instant::now() >= until {
            return Err(timed_out());
        }
        // Whether or not the kill went through, look for the chunk's answer.
        let _ = shared.kill_query(id, until).await;
        let wait = (Instant::now() + KILL_AGAIN).min(until);
        if let Ok(result) = tokio::time::timeout_at(wait.into(), parked.as_mut()).await {
            return outcome(result);
        }
    }
}

/// A failed renewal.
enum Renewal {
    /// The row does not show the hold (cannot happen while the transaction lives).
    NotHeld,
    /// The connection is gone (or was closed for not answering): the hold is over.
    Lost(sqlx::Error),
    /// Any other failure; the hold may well be intact.
    Failed(sqlx::Error),
}

/// Confirms the hold's connection is alive and still holds the row, and sets its server-side
/// idle limit to `ttl`; answers the send time of the check.
async fn renew(
    shared: &Shared,
    name: &LockName,
    token: &LeaseToken,
    dedicated: &mut Dedicated,
    ttl: Duration,
) -> Result<Instant, Renewal> {
    let set_wait_timeout = dedicated.wait_timeout_for(ttl);
    let until = Instant::now() + shared.statement_timeout;
    let sent = Instant::now();
    let read = async {
        // Only when the TTL changed (an extension, or after the last chunk): one more round trip.
        if !set_wait_timeout.is_empty() {
            run(&mut dedicated.conn, AssertSqlSafe(set_wait_timeout)).await?;
        }
        sqlx::query_scalar::<_, Option<Vec<u8>>>(AssertSqlSafe(shared.held.clone()))
            .bind(name.as_str().as_bytes())
            .fetch_optional(&mut dedicated.conn)
            .await
    };
    match within(until, read).await {
        Ok(found)
            if found.as_ref().and_then(Option::as_deref) == Some(token.as_str().as_bytes()) =>
        {
            Ok(sent)
        }
        Ok(_) => Err(Renewal::NotHeld),
        Err(error) if classify(&error) == Class::Connection => Err(Renewal::Lost(error)),
        Err(error) => Err(Renewal::Failed(error)),
    }
}
