//! The anchor parked statements wait on: a user lock (`GET_LOCK`) a client keeps on a
//! connection of its own, so a parked statement waits in a way `KILL QUERY` stops at once.
//! Both strategies park: a row-lock hold keeps a statement parked on its connection between
//! commands (see `row_lock::hold`), and a lease waiter parks until a release hands it the
//! lease (see `lease::queue`); a renewal, a release or a hand-off stops the parked statement
//! with `KILL QUERY`.
//!
//! **Why.** A parked `SLEEP` makes those kills slow exactly when they are many: MariaDB wakes
//! a killed `SLEEP` only once it holds a mutex every sleeping session shares, trying every
//! 50 ms for up to 2 s. 20 sessions in `SLEEP` killed at once, 6 rounds on this project's
//! machine: the slowest kill took 2.0 to 4.0 s in 3 rounds, so 20 holds of a 1 s TTL renewed
//! together lost their locks (conformance `watchdog/batches_renewals` in CI; `hold_end`'s
//! `row_lock/many_parked_holds_keep_their_locks` lost 40 of 40, 4 runs of 4). The same with
//! 16 parked lease waiters, each killed and parking again at once, two kills at a time for
//! 8 s: the slowest kill took 2.0 s (two over 40 ms); waiting in `GET_LOCK` instead, 7 ms at
//! worst in two such runs. (`gdb` on the server during one: two `KILL`s in
//! `THD::abort_current_cond_wait`, retrying the shared mutex, while a woken sleeper held it.)
//! A session waiting for a user lock waits on a mutex of its own. So parked statements wait
//! in `GET_LOCK(<anchor>, <seconds>)` on a lock this client holds: it never comes free while
//! the anchor's connection lives, and each wait ends at its timeout (returning 0) as the
//! sleep did.
//!
//! **When the anchor's connection ends** (an operator's `KILL`, a server restart), its lock
//! comes free: a parked statement takes it, gives it back in the same statement, and ends
//! early; its owner reports the anchor [lost](Anchor::lost). Until a new anchor is up (under a
//! new name; raised in the background, again after 1 s, 2 s, ... up to a minute while raises
//! fail), statements park in `SLEEP` as before. Only the cost of stopping them changes.
//!
//! **When it is raised.** A row-lock backend raises it while it connects: each of its holds
//! parks, and holds parked in `SLEEP` while the anchor was being raised (the first holds of a
//! new client) were stopped as slowly as above: 32 new clients each releasing its first hold
//! at once, the slowest release took 2.0-4.0 s in 3 runs of 3 (`hold_end`'s
//! `row_lock/first_holds_of_new_clients_release_at_once`; 13-35 ms now), and one or two steps
//! of the client sweep fell to 12-71 turns a second (two steps in the compare at 22787fb, one
//! or two in each of 3 runs since), the server idle, every kill waiting. A lease backend
//! raises it at its first park, in the background (a lease client that never waits opens no
//! anchor); until it is up, parks use `SLEEP`. Once up it stays for the backend's life.
//!
//! **Where.** MariaDB only: `GET_LOCK` takes microseconds in its timeout since MariaDB
//! 10.1.2 (MDEV-4018), which a lease's last chunk needs; MySQL rounds it to whole seconds,
//! and statements there park in `SLEEP`.
//!
//! **Its connection** is, for a row-lock backend, the pool's connection its schema was checked
//! on when it connected, taken out of the pool (detached: the pool may open another in its
//! place); otherwise (a lease backend's, or a raise after a loss) the connection kept beside
//! the pool when it is idle (see [`crate::kept`]), or a connection idle in the pool, taken out
//! of it, or where none is idle a new one (a raise does not wait for the pool, which parked
//! lease waiters may fill). It runs the pool's session setup. Holding its user lock is all it
//! does, so the client's short statements run on it too ([`Anchor::execute_short`], see
//! [`lending`]): a row-lock client's fence bumps and kills, a lease client's tries and lone
//! releases. A row-lock client running one lock at a time so needs no connection beside its
//! holds' and waits' but this one, and a waiting lease client none beside its pool's.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use lock_core::{LockError, backend::LeaseToken};
use sqlx::{
    AssertSqlSafe, MySql, MySqlConnection, MySqlPool, mysql::MySqlConnectOptions,
    pool::PoolConnection,
};

use crate::{
    error::Error,
    kept::{self, Kept},
    sql::{connect_within, run, tagged, within},
};

mod lending;

/// The session variable a parked `GET_LOCK` leaves its answer in (1: it took the anchor).
pub(crate) const TOOK_VAR: &str = "@lock_park";

/// The longest `SLEEP` chunk while an anchor is being raised.
pub(crate) const WHILE_RAISING: Duration = Duration::from_millis(50);

/// The wait after a failed raise before the next; it doubles with each failure in a row, up
/// to [`RAISE_BACKOFF_MAX`].
const RAISE_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between raises that fail.
const RAISE_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The server's longest idle limit (seconds): the anchor's connection is idle but for the
/// short statements it is lent to (see [`lending`]), which may be none for hours.
const ANCHOR_IDLE_SECS: u64 = 31_536_000;

/// The anchor of one backend: its user lock's name while its connection holds it.
pub(crate) struct Anchor {
    state: Mutex<State>,
    settings: Settings,
    /// The client's connection kept beside the pool: short statements run there when the
    /// anchor's is lent or down (see [`Anchor::execute_short`]), and a raise takes it when it
    /// is idle (see [`Anchor::open`]).
    kept: Arc<Kept>,
}

/// Where an anchor's connection is taken from.
#[derive(Clone)]
pub(crate) struct Settings {
    /// The pool whose idle connection the anchor takes (and detaches), when one is idle.
    pub(crate) pool: MySqlPool,
    /// The server and account, for a connection of its own when none is idle in the pool.
    pub(crate) connect: MySqlConnectOptions,
    /// The session setup the pool's connections run (`SET SESSION ...`), run on the anchor's
    /// connection too: the row lock runs its fence bumps there.
    pub(crate) setup: String,
    /// The bound of getting the connection.
    pub(crate) connect_timeout: Duration,
    /// The bound of the statement that takes the user lock.
    pub(crate) statement_timeout: Duration,
    /// Whether the server is MariaDB (only there is an anchor raised).
    pub(crate) mariadb: bool,
}

#[derive(Default)]
struct State {
    /// The user lock's name and the connection holding it.
    up: Option<Up>,
    /// A raise is under way.
    raising: bool,
    /// Raises failed in a row since the last success.
    failures: u32,
    /// No raise starts before this.
    next_try: Option<Instant>,
}

/// An anchor that is up.
struct Up {
    /// The user lock's name.
    name: Arc<str>,
    /// The connection holding it, while no statement borrows it (see [`Anchor::lend`]).
    conn: Option<MySqlConnection>,
    /// Since when the connection has been idle.
    idle_since: Instant,
}

impl Anchor {
    /// An anchor not raised yet (it is raised by [`Anchor::raise_on`] when a row-lock backend
    /// connects, or at the first [`Anchor::name`] due), beside the client's `kept` connection.
    pub(crate) fn new(settings: Settings, kept: Arc<Kept>) -> Self {
        Self {
            state: Mutex::default(),
            settings,
            kept,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The name parked statements wait on, while the anchor holds it.
    fn up_name(&self) -> Option<Arc<str>> {
        self.state().up.as_ref().map(|up| up.name.clone())
    }

    /// A parked statement took the user lock `name`: its anchor's connection has ended. Drops
    /// that anchor (a newer one, under another name, stays).
    pub(crate) fn lost(&self, name: &str) {
        let mut state = self.state();
        if state.up.as_ref().is_some_and(|up| &*up.name == name) {
            tracing::warn!(
                anchor = name,
                "the anchor's connection ended; statements park in SLEEP until it is back"
            );
            let conn = state.up.take().and_then(|up| up.conn);
            drop(state);
            if let Some(conn) = conn {
                kept::close(conn);
            }
        }
    }

    /// Whether a raise is under way (parked statements then wait in short chunks, to move to
    /// the anchor soon).
    pub(crate) fn raising(&self) -> bool {
        self.state().raising
    }

    /// Whether a raise should start now (none is up or under way, and the back-off after
    /// failed ones is over); if so, marks one under way (until its [`Raise`] is dropped).
    fn claim_raise(&self) -> bool {
        let mut state = self.state();
        let due = state.up.is_none()
            && !state.raising
            && state.next_try.is_none_or(|next| Instant::now() >= next);
        if due {
            state.raising = true;
        }
        due
    }

    /// Ends the raise under way with its outcome: the anchor, or a failure (the next try
    /// waits [`RAISE_BACKOFF`], doubled for each failure in a row, at most
    /// [`RAISE_BACKOFF_MAX`]).
    fn finish_raise(&self, up: Option<(Arc<str>, MySqlConnection)>) {
        let mut state = self.state();
        state.raising = false;
        if let Some((name, conn)) = up {
            state.up = Some(Up {
                name,
                conn: Some(conn),
                idle_since: Instant::now(),
            });
            state.failures = 0;
            state.next_try = None;
        } else {
            let wait = RAISE_BACKOFF
                .saturating_mul(1 << state.failures.min(6))
                .min(RAISE_BACKOFF_MAX);
            state.failures = state.failures.saturating_add(1);
            state.next_try = Some(Instant::now() + wait);
        }
    }
}

impl std::fmt::Debug for Anchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anchor")
            .field("name", &self.up_name())
            .field("raising", &self.raising())
            .finish_non_exhaustive()
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        // Say goodbye to the server (it would log an aborted connection otherwise).
        if let Some(conn) = self.state().up.take().and_then(|up| up.conn) {
            kept::close(conn);
        }
    }
}

/// A raise under way, owned by its task: however the task ends (done, failed, or dropped with
/// its runtime), dropping this ends the raise, so one is never under way for ever.
struct Raise {
    anchor: Arc<Anchor>,
    up: Option<(Arc<str>, MySqlConnection)>,
}

impl Raise {
    /// The raise of `anchor`, claimed by [`Anchor::claim_raise`].
    fn new(anchor: Arc<Anchor>) -> Self {
        Self { anchor, up: None }
    }

    /// Takes the anchor's connection (`given`, or one of the pool's) and its user lock, within
    /// the connect and statement bounds; the outcome takes effect when this ends.
    async fn run(mut self, given: Option<MySqlConnection>) {
        let settings = &self.anchor.settings;
        let bound = settings.connect_timeout + settings.statement_timeout;
        match tokio::time::timeout(bound, self.anchor.open(given)).await {
            Ok(Ok(up)) => self.up = Some(up),
            Ok(Err(error)) => {
                tracing::warn!(%error, "raising the anchor failed; statements park in SLEEP");
            }
            Err(_) => {
                tracing::warn!("raising the anchor took over {bound:?}; statements park in SLEEP");
            }
        }
    }
}

impl Drop for Raise {
    fn drop(&mut self) {
        self.anchor.finish_raise(self.up.take());
    }
}

impl Anchor {
    /// The anchor's name for the next parked statement; without one (not MariaDB, not raised
    /// yet, or lost), `None`, and a raise starts in the background when one is due.
    pub(crate) fn name(self: &Arc<Self>) -> Option<Arc<str>> {
        if !self.settings.mariadb {
            return None;
        }
        if let Some(name) = self.up_name() {
            return Some(name);
        }
        if self.claim_raise() {
            tokio::spawn(Raise::new(self.clone()).run(None));
        }
        None
    }

    /// Raises the anchor now on `conn` (one of the pool's, then detached from it) and waits
    /// for the outcome, when one is due (MariaDB, none up or under way, no back-off running);
    /// a failure is logged, and parked statements then wait in `SLEEP` until a later raise
    /// succeeds. When none is due, `conn` goes back to the pool.
    ///
    /// # Cancel safety
    /// Dropping the future ends the raise as failed (the next one waits the back-off).
    pub(crate) async fn raise_on(self: &Arc<Self>, conn: PoolConnection<MySql>) {
        if self.settings.mariadb && self.claim_raise() {
            Raise::new(self.clone()).run(Some(conn.detach())).await;
        }
    }

    /// Takes a user lock of a fresh random name on `given`, or else on the kept connection
    /// when it is idle (it becomes the anchor's, and the statements it ran go to the anchor
    /// from then on, so the client keeps one connection for both), or else on a connection
    /// idle in the pool (taken out of it: the pool may open another in its place), or else
    /// (none is idle: a raise does not wait for the pool, which parked waiters may fill, nor
    /// take a connection its callers wait for; or the idle one failed) on a new connection.
    async fn open(
        &self,
        given: Option<MySqlConnection>,
    ) -> Result<(Arc<str>, MySqlConnection), LockError> {
        let settings = &self.settings;
        let given = given
            .or_else(|| self.kept.take_for_anchor())
            .or_else(|| settings.pool.try_acquire().map(PoolConnection::detach));
        if let Some(conn) = given
            && let Ok(up) = self.take_lock(conn).await
        {
            return Ok(up);
        }
        let conn = connect_within(
            &settings.connect,
            settings.connect_timeout,
            "taking the anchor",
        )
        .await?;
        self.take_lock(conn).await
    }

    /// Runs the session setup on `conn` and takes a user lock of a fresh random name there.
    async fn take_lock(
        &self,
        mut conn: MySqlConnection,
    ) -> Result<(Arc<str>, MySqlConnection), LockError> {
        let what = "taking the anchor";
        let settings = &self.settings;
        let setup = if settings.setup.is_empty() {
            String::new()
        } else {
            format!("{}; ", settings.setup)
        };
        // A lease token is 32 random hex digits: a name nobody else holds.
        let name: Arc<str> = format!("lock-mysql/park/{}", LeaseToken::random().as_str()).into();
        let until = Instant::now() + settings.statement_timeout;
        let rows = within(
            until,
            run(
                &mut conn,
                AssertSqlSafe(format!(
                    "{setup}SET SESSION wait_timeout = {ANCHOR_IDLE_SECS}; \
                     SELECT 'anchor', CAST(GET_LOCK('{name}', 0) AS UNSIGNED)"
                )),
            ),
        )
        .await
        .map_err(|e| LockError::from(Error::new(what, e)))?;
        let took = tagged(&rows, "anchor")
            .next()
            .map(|row| sqlx::Row::try_get::<Option<u64>, _>(row, 1))
            .transpose()
            .map_err(|e| LockError::from(Error::new(what, e)))?
            .flatten();
        if took != Some(1) {
            return Err(LockError::backend_msg(format!(
                "{what}: GET_LOCK('{name}', 0) answered {took:?}, not 1"
            )));
        }
        Ok((name, conn))
    }
}
