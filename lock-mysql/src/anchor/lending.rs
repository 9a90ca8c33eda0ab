//! The anchor's connection lent for short statements ([`Anchor::execute_short`]): a row-lock
//! client runs its fence bumps and the kills of its parked statements there, so that it needs
//! no connection beside its holds' but this one (see [`crate::row_lock`]); a lease client its
//! tries and lone releases, so that, once it has waited (which raised the anchor, on the
//! connection kept beside the pool), it needs none beside its pool's.
//!
//! The connection keeps its user lock while it is lent: the statements it runs (autocommitted
//! upserts and updates, a `KILL QUERY` of another session) leave its session as it was (but
//! for `LAST_INSERT_ID()`, which nothing else reads there), and parked statements go on
//! waiting on the anchor. It is lent to one statement at a time; a statement that finds it
//! lent (or the anchor down) runs on the connection kept beside the pool, as every such
//! statement did before.
//!
//! It is treated much as [`crate::kept`] treats the kept connection, except that a late answer
//! does not end it (ending it frees its user lock: every parked statement of the client would
//! take it and park in `SLEEP` until a new anchor is up, the slow kills the anchor exists to
//! avoid, and at a moment when the server is slow already):
//! - idle for [`kept::TRUSTED_IDLE`] or longer, it is pinged before it is lent (the server may
//!   have gone away meanwhile), in the background: when the answer comes after the caller's
//!   bound, the caller runs its statement elsewhere and the connection is lent again later;
//!   a ping that fails, or gets no answer for [`kept::DRAIN_FOR`], ends the anchor;
//! - a statement whose connection broke (a transport error, or the server's word that the
//!   session ends: killed, shutting down) ends the anchor: its connection is dropped, its user
//!   lock comes free on the server, and parked statements take it and report it lost, as when
//!   an operator kills it (see [`crate::anchor`]); a new one is raised when the next statement
//!   parks. Any other error the server answered (a read-only server's included) leaves the
//!   session as it was: the connection is lent again;
//! - a statement whose answer did not come by its bound, or that was dropped midway, leaves the
//!   connection to a ping in the background, which waits for the statement to end (for at
//!   most [`kept::DRAIN_FOR`]); it is lent again if the ping answers (a second ping when the
//!   first answered the statement's error), and the anchor ends otherwise.

use std::{sync::Arc, time::Instant};

use sqlx::{Connection, Execute, Executor, MySql, MySqlConnection, mysql::MySqlQueryResult};
use tokio::sync::oneshot;

use super::Anchor;
use crate::{
    error::{Class, classify, server_code},
    kept,
    sql::{is_timed_out, within},
};

/// The anchor's connection, lent to one statement by [`Anchor::lend`]. Dropped before
/// [`Lent::execute_within`] ended (its statement's future was dropped), it is drained (see
/// the module docs).
pub(crate) struct Lent {
    anchor: Arc<Anchor>,
    /// The anchor's name when it was lent: it goes back only to that anchor.
    name: Arc<str>,
    /// `Some` until given back or dropped.
    conn: Option<MySqlConnection>,
}

impl Anchor {
    /// The anchor's connection for one short statement, by `until`: `None` when no anchor is
    /// up, its connection is lent, or (idle for [`kept::TRUSTED_IDLE`] or longer) its ping
    /// did not answer by `until` (it goes on in the background, see the module docs).
    ///
    /// # Cancel safety
    /// Dropping the future leaves a ping under way to end in the background.
    pub(crate) async fn lend(self: &Arc<Self>, until: Instant) -> Option<Lent> {
        let (name, conn, idle_for) = {
            let mut state = self.state();
            let up = state.up.as_mut()?;
            let conn = up.conn.take()?;
            (up.name.clone(), conn, up.idle_since.elapsed())
        };
        let conn = if idle_for < kept::TRUSTED_IDLE {
            conn
        } else {
            self.pinged(&name, conn, until).await?
        };
        Some(Lent {
            anchor: self.clone(),
            name,
            conn: Some(conn),
        })
    }

    /// `conn` once its ping answered, if that was by `until`. The ping runs in a task of its
    /// own, so that it is never dropped midway (sqlx does not track a ping it sent as it tracks
    /// a statement: a ping dropped midway would leave its answer unread): answered later, the
    /// connection is given back; failed or unanswered for [`kept::DRAIN_FOR`], the anchor ends.
    async fn pinged(
        self: &Arc<Self>,
        name: &Arc<str>,
        conn: MySqlConnection,
        until: Instant,
    ) -> Option<MySqlConnection> {
        let (answer, mut answered) = oneshot::channel();
        self.drain(name.clone(), conn, Some(answer));
        match tokio::time::timeout_at(until.into(), &mut answered).await {
            Ok(answered) => answered.ok(),
            Err(_) => {
                // Late: whatever comes now goes back.
                answered.close();
                if let Ok(conn) = answered.try_recv() {
                    self.give_back(name, conn);
                }
                None
            }
        }
    }

    /// Pings `conn` in the background (waiting for any statement left on it to end) for at
    /// most [`kept::DRAIN_FOR`]: once it answers, it goes to `to` while that still listens,
    /// else back to the anchor `name`; failed or unanswered, the anchor ends. Without a
    /// runtime the anchor ends at once.
    fn drain(
        self: &Arc<Self>,
        name: Arc<str>,
        conn: MySqlConnection,
        to: Option<oneshot::Sender<MySqlConnection>>,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.lost(&name);
            drop(conn);
            return;
        };
        let anchor = self.clone();
        runtime.spawn(async move {
            let mut conn = conn;
            if tokio::time::timeout(kept::DRAIN_FOR, answered(&mut conn))
                .await
                .is_ok_and(|answered| answered)
            {
                let unsent = match to {
                    Some(to) => to.send(conn).err(),
                    None => Some(conn),
                };
                if let Some(conn) = unsent {
                    anchor.give_back(&name, conn);
                }
            } else {
                anchor.lost(&name);
                drop(conn);
            }
        });
    }

    /// Takes back the connection of the anchor `name`, idle from now; closes it when that
    /// anchor is no longer up (it was reported lost meanwhile).
    fn give_back(&self, name: &str, conn: MySqlConnection) {
        let mut state = self.state();
        match state.up.as_mut() {
            Some(up) if &*up.name == name && up.conn.is_none() => {
                up.conn = Some(conn);
                up.idle_since = Instant::now();
            }
            _ => {
                drop(state);
                kept::close(conn);
            }
        }
    }
}

impl Anchor {
    /// Runs a short statement (`query` makes it) by `until` on the anchor's connection when it
    /// is lent ([`Anchor::lend`]), else on the connection kept beside the pool or a pooled one
    /// (see [`crate::kept`]). A statement that failed on the anchor's connection with a
    /// connection error, not for want of time, runs again there: the anchor's session had gone
    /// ([`session_gone`]: the anchor ends with it, and is raised again when a statement next
    /// parks), or its server no longer takes writes (read-only, 1290 or 1836: after a
    /// fail-over, a connection opened now may reach the new primary, while the anchor's,
    /// which that answer does not end, stays on the old one until a park finds its user lock
    /// free there). Only for statements that may run twice (a fence bump, a kill, a lease try:
    /// see [`Anchor::execute_short_once`] for the others).
    ///
    /// # Errors
    /// The statement's, the pool's, or [`crate::sql::timed_out`] at `until`.
    pub(crate) async fn execute_short<'q, Q>(
        self: &Arc<Self>,
        until: Instant,
        query: impl Fn() -> Q,
    ) -> Result<MySqlQueryResult, sqlx::Error>
    where
        Q: Execute<'q, MySql> + 'q,
    {
        if let Some(lent) = self.lend(until).await {
            match lent.execute_within(until, query()).await {
                Err(error) if classify(&error) == Class::Connection && !is_timed_out(&error) => {}
                done => return done,
            }
        }
        self.kept.execute_within(until, query()).await
    }

    /// [`Anchor::execute_short`] without the second run: for a statement whose first run may
    /// have taken effect though its answer was lost (a lone release: run again, it finds
    /// nothing to release, and the caller would hear "not held" of a lock it held). The
    /// error stands; the caller decides.
    ///
    /// # Errors
    /// The statement's, the pool's, or [`crate::sql::timed_out`] at `until`.
    pub(crate) async fn execute_short_once<'q>(
        self: &Arc<Self>,
        until: Instant,
        query: impl Execute<'q, MySql> + 'q,
    ) -> Result<MySqlQueryResult, sqlx::Error> {
        match self.lend(until).await {
            Some(lent) => lent.execute_within(until, query).await,
            None => self.kept.execute_within(until, query).await,
        }
    }
}

impl Lent {
    /// Runs `query` (a prepared query or raw SQL) on the anchor's connection, by `until`, and
    /// hands the connection back as the module docs say: lent again after an answer (an error
    /// the server answered included), drained after no answer in time, and the anchor ended
    /// after an error that says its session is gone ([`session_gone`]).
    ///
    /// # Errors
    /// The statement's, or [`crate::sql::timed_out`] at `until`.
    pub(crate) async fn execute_within<'q>(
        mut self,
        until: Instant,
        query: impl Execute<'q, MySql> + 'q,
    ) -> Result<MySqlQueryResult, sqlx::Error> {
        let Some(conn) = self.conn.as_mut() else {
            unreachable!("a lent anchor holds its connection until it hands it back, here")
        };
        let result = within(until, conn.execute(query)).await;
        match &result {
            // Drained when dropped below.
            Err(error) if is_timed_out(error) => {}
            Err(error) if session_gone(error) => {
                if let Some(conn) = self.conn.take() {
                    self.anchor.lost(&self.name);
                    // Dropped, not closed politely: it may be mid-answer.
                    drop(conn);
                }
            }
            _ => {
                if let Some(conn) = self.conn.take() {
                    self.anchor.give_back(&self.name, conn);
                }
            }
        }
        result
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.anchor.drain(self.name.clone(), conn, None);
        }
    }
}

/// Pings `conn` until it answers, waiting for any statement left on it to end: `false` when
/// the connection failed. A statement left on it that ended in an error makes the first ping
/// answer that error (sqlx reads the statement's answer first); the session is back in step
/// then, and the next ping answers for itself.
async fn answered(conn: &mut MySqlConnection) -> bool {
    // At most one statement is left on it: at most one answer before the ping's own.
    for _ in 0..2 {
        match conn.ping().await {
            Ok(()) => return true,
            Err(sqlx::Error::Database(_)) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Whether `error` says the anchor's session is gone or going: a transport error (not
/// [`crate::sql::timed_out`]'s), or a server error of [`Class::Connection`] other than those
/// a live session answers (a read-only server's 1290 and 1836; 1040, too many connections,
/// comes only at login).
fn session_gone(error: &sqlx::Error) -> bool {
    classify(error) == Class::Connection
        && !is_timed_out(error)
        && !matches!(server_code(error), Some(1290 | 1836 | 1040))
}
