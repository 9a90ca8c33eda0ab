//! The lease strategy's acquisition: one statement per try, a place in the waiters' queue
//! when busy, parking on a pooled connection until a release hands the lease over.

use std::{
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
    time::{Duration, Instant},
};

use lock_core::{
    Fence, Lease, LockError, LockName,
    backend::{AcquireRequest, Attempt, Grant, LeaseToken, local_deadline, poll_until_acquired},
};
use sqlx::{AssertSqlSafe, Row, mysql::MySqlQueryResult};

use super::{
    ANSWER_GRACE, Arg, LeaseStrategy, MIN_TRY,
    gate::{self, Entered},
    micros, queue,
};
use crate::{
    error::{Class, Error, classify},
    rows::{LEASE_COLUMNS, LeaseRow, LeaseState},
    sql::{retry_deadlocks, run, run_pooled, tagged, within},
};

/// Takes an abandoned `acquire` call's place out of the queue, in the background, when the
/// call is dropped before it answered (see [`LeaseStrategy::leave`]); that also frees a lease
/// a try in flight took for the call. A call dropped during its first try (before any queue
/// batch) leaves such a lease to its TTL.
struct PlaceGuard<'a> {
    strategy: &'a LeaseStrategy,
    name: &'a LockName,
    token: &'a LeaseToken,
    queued: &'a AtomicBool,
    armed: bool,
}

impl Drop for PlaceGuard<'_> {
    fn drop(&mut self) {
        if !self.armed || !self.queued.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: the place lapses.
            return;
        };
        let (pool, until) = (self.strategy.pool.clone(), self.strategy.statement_until());
        let sql = queue::leave_batch(
            &self.strategy.table,
            self.name.as_str().as_bytes(),
            self.token.as_str().as_bytes(),
            self.strategy.limits.mariadb,
        );
        let name = self.name.clone();
        drop(runtime.spawn(async move {
            if let Err(error) = run_pooled(&pool, sql, until).await {
                tracing::debug!(lock = %name, %error, "leaving the waiters' queue failed; the place lapses");
            }
        }));
    }
}

/// What a busy batch found (see [`LeaseStrategy::queue_up`]).
type Queued = (Option<LeaseState>, i64, bool);

/// The outcome of one acquire try.
enum Try {
    Granted(Grant),
    /// Busy; the holder's time left, when known.
    Busy(Option<Duration>),
    /// Busy; the caller parked until woken (`woken`: by the release that handed it the lease,
    /// as a rule) or its park ended: try again at once.
    Parked {
        woken: bool,
    },
    /// Busy, and the caller is first in line: try again soon (or, if the holder's time left is
    /// shorter, then).
    First(Option<Duration>),
    /// Free, and the caller is next in line: try again at once.
    Next,
}

impl LeaseStrategy {
    /// Acquires by polling: one statement per try, jittered back-off between tries bounded by
    /// the holder's remaining TTL as the server reports it.
    /// A busy try takes a place in the waiters' queue when there is something to wait for
    /// (see [`queue`]); the first waiter tries again at short intervals.
    pub(crate) async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        // One token for every try of this call: it names the call's place in the queue.
        let token = LeaseToken::random();
        let place = queue::place_for(request.backoff().max);
        let turn = queue::turn_for(request.backoff().max);
        let streak = AtomicU32::new(0);
        let queued = AtomicBool::new(false);
        // The gate, once the call holds it (see `gate`); dropped with the call, it closes its
        // connection, which gives it back.
        let gate = gate::Slot::default();
        // If this future is dropped while it may have a place, the place (and a lease handed
        // to it meanwhile) goes in the background.
        let mut dropped = PlaceGuard {
            strategy: self,
            name: request.name(),
            token: &token,
            queued: &queued,
            armed: true,
        };
        let result = poll_until_acquired(request, || async {
            let mut outcome = self
                .try_once(request, &token, (place, turn), (&queued, false), &gate)
                .await?;
            // After a park (woken, or its time up) try again at once, while the budget lasts.
            while let Try::Parked { woken } = outcome
                && Instant::now() < request.deadline()
            {
                outcome = self
                    .try_once(request, &token, (place, turn), (&queued, woken), &gate)
                    .await?;
            }
            Ok(match outcome {
                Try::Granted(grant) => Attempt::Acquired(grant),
                Try::Parked { .. } | Try::Next => Attempt::Busy {
                    expires_in: Some(Duration::ZERO),
                },
                Try::Busy(expires_in) => {
                    streak.store(0, Ordering::Relaxed);
                    Attempt::Busy { expires_in }
                }
                Try::First(expires_in) => {
                    let n = streak.fetch_add(1, Ordering::Relaxed);
                    let soon = queue::first_delay(n);
                    Attempt::Busy {
                        expires_in: Some(expires_in.map_or(soon, |left| left.min(soon))),
                    }
                }
            })
        })
        .await;
        dropped.armed = false;
        gate.leave();
        if queued.load(Ordering::Relaxed) {
            if result.is_ok() {
                self.waited.mark(&token);
            }
            self.leave(request.name(), &token, result.is_ok()).await;
        }
        result
    }

    /// Takes the place of `token` out of the queue: in the background after a grant (the
    /// grant need not wait for it: while the lease is held the place stands in nobody's way,
    /// and a release that comes first takes it out itself, see
    /// [`queue::release_batch`]), else before answering, for at most [`ANSWER_GRACE`] (so a
    /// caller that tries again at once finds its old place gone, as a rule), then in the
    /// background: a waiter whose budget ran out answers `Timeout` on time however busy the
    /// server is (fault case `lease/a_slow_leaving_answers_on_time`). A place that cannot be
    /// deleted lapses.
    async fn leave(&self, name: &LockName, token: &LeaseToken, granted: bool) {
        let pool = self.pool.clone();
        let sql = if granted {
            // The lease is the caller's now: only the place goes.
            queue::leave_place(
                &self.table,
                name.as_str().as_bytes(),
                token.as_str().as_bytes(),
            )
        } else {
            queue::leave_batch(
                &self.table,
                name.as_str().as_bytes(),
                token.as_str().as_bytes(),
                self.limits.mariadb,
            )
        };
        let until = self.statement_until();
        let name = name.clone();
        let leave = async move {
            if let Err(error) = run_pooled(&pool, sql, until).await {
                tracing::debug!(lock = %name, %error, "leaving the waiters' queue failed; the place lapses");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if granted => drop(runtime.spawn(leave)),
            // Dropping the task's handle when the wait is over leaves it running.
            Ok(runtime) => drop(tokio::time::timeout(ANSWER_GRACE, runtime.spawn(leave)).await),
            Err(_) => leave.await,
        }
    }

    /// One try: insert the row, or take it over if it is released or expired and nobody
    /// queues ahead. The try ends by the wait budget (at least [`MIN_TRY`]): a row another
    /// transaction keeps locked makes it busy then, whatever `innodb_lock_wait_timeout` says.
    /// A busy try takes (or keeps) the caller's place in the queue, unless the lease is free
    /// and nobody else queues, and tells whether it is first (`queued` is set once it may have
    /// a place).
    ///
    /// The call's first try (no place yet), and a try right after a park a release woke (it handed
    /// the caller the lease, which the statement's "taken" rule covers: the row holds the caller's
    /// token), takes only a new row, one released while nobody queued or one handed to the caller,
    /// without reading the queue (see [`Statements::acquire_first`](super)); if it finds the row
    /// free otherwise (expired, or freed while someone queued) and the caller first in line (its
    /// place taken, or none needed: nobody else queues), it tries again at once with the
    /// statement that reads the queue, whatever is left of the budget: a free lock is not busy
    /// to a single try.
    ///
    /// The call's first busy try waits for the lock's [gate] first, when it may park and has a
    /// wait budget; its budget running out there makes it busy.
    async fn try_once(
        &self,
        request: &AcquireRequest,
        token: &LeaseToken,
        turns: (Duration, Duration),
        (queued, woken): (&AtomicBool, bool),
        gate: &gate::Slot,
    ) -> Result<Try, LockError> {
        let name = request.name();
        let mut first = woken || !queued.load(Ordering::Relaxed);
        // The call's very first try does not wait for the lease row's lock (MariaDB): with a
        // thousand waiters arriving at once, first tries queued on that lock by the hundred
        // (678 sessions sampled at once) and the server answered almost nothing for seconds.
        // A first try that finds the row locked goes through the gate if it has a budget to
        // wait, then tries again, waiting for the row (a one-try call only that).
        let mut nowait = !queued.load(Ordering::Relaxed) && !gate.tried() && self.limits.mariadb;
        loop {
            let sent = Instant::now();
            let limit = request
                .deadline()
                .saturating_duration_since(sent)
                .max(MIN_TRY);
            // The server stops the statement at `limit`; its answer gets a little longer.
            let until = sent + limit + ANSWER_GRACE;
            let sent_nowait = std::mem::take(&mut nowait);
            let kind = (first, sent_nowait);
            let taken = match self.send_acquire(request, token, kind, limit, until).await {
                Ok(done) => done.last_insert_id(),
                // The row is locked (by a thousand arriving waiters' tries, say): through the
                // gate first (with a budget to wait), then the try again, waiting for the row
                // as long as the budget (a one-try call: `MIN_TRY`).
                Err(error) if sent_nowait && classify(&error) == Class::LockWait => {
                    if Instant::now() < request.deadline() && !self.enter_gate(request, gate).await
                    {
                        return Ok(Try::Busy(None));
                    }
                    continue;
                }
                // Someone kept the row locked past the try's limit: busy, try again later. Or
                // a release's wake-up meant for this client's park landed on the try (it read
                // the park's marker just before the park ended): nothing was taken, try again.
                Err(error)
                    if matches!(
                        classify(&error),
                        Class::LockWait | Class::StatementTimeout | Class::Interrupted
                    ) =>
                {
                    return Ok(Try::Busy(None));
                }
                Err(error) => {
                    return Err(LockError::from(Error::new(
                        format!("acquiring `{name}`"),
                        error,
                    )));
                }
            };
            if taken == 0 {
                // The call's first busy try, with a budget: through the gate.
                let arriving = !queued.load(Ordering::Relaxed)
                    && !gate.tried()
                    && Instant::now() < request.deadline();
                return match self
                    .busy(request, token, turns, until, (gate, queued, arriving))
                    .await?
                {
                    Try::Next if first => {
                        first = false;
                        continue;
                    }
                    outcome => Ok(outcome),
                };
            }
            let grant = Lease::new(
                name.clone(),
                token.clone(),
                Fence::new(taken),
                request.ttl(),
            );
            if Instant::now() >= local_deadline(sent, request.ttl()) {
                // The answer came too late to be of use: the caller's hold would be over
                // before it began. Give the row back and try again (or time out).
                tracing::debug!(lock = %name, "a grant came back past its local deadline; releasing it");
                let _ = self.release(&grant).await;
                return Ok(Try::Busy(Some(Duration::ZERO)));
            }
            return Ok(Try::Granted(Grant::new(grant, sent)));
        }
    }

    /// When the answer of a statement sent now must have come (the wait budget left, at least
    /// [`MIN_TRY`], and [`ANSWER_GRACE`]).
    fn try_until(&self, request: &AcquireRequest) -> Instant {
        let now = Instant::now();
        now + request
            .deadline()
            .saturating_duration_since(now)
            .max(MIN_TRY)
            + ANSWER_GRACE
    }

    /// The acquire statement of one try (a `first` one or not, see [`Self::try_once`]),
    /// stopped by the server after `limit` when that is shorter than the sessions' own
    /// lock-wait limit, its answer awaited until `until`.
    /// A `nowait` one does not wait for the row's lock at all (MariaDB only).
    async fn send_acquire(
        &self,
        request: &AcquireRequest,
        token: &LeaseToken,
        (first, nowait): (bool, bool),
        limit: Duration,
        until: Instant,
    ) -> Result<MySqlQueryResult, sqlx::Error> {
        let name = request.name();
        let ttl = micros(request.ttl());
        let server_bound = limit < self.limits.lock_wait;
        let k = token.as_str().as_bytes();
        retry_deadlocks(|| async {
            if server_bound {
                let sql = self.bounded_acquire(
                    (first, nowait),
                    (name.as_str().as_bytes(), k),
                    ttl,
                    limit,
                );
                self.anchor
                    .execute_short(until, || sqlx::raw_sql(AssertSqlSafe(sql.clone())))
                    .await
            } else {
                let (statement, args) = self.sql.acquire(first, nowait);
                let query = || {
                    let mut query = sqlx::query(AssertSqlSafe(statement.clone()));
                    for arg in args {
                        query = match arg {
                            Arg::Name => query.bind(name.as_str().as_bytes()),
                            Arg::Token => query.bind(k),
                            Arg::Ttl => query.bind(ttl),
                        };
                    }
                    query
                };
                self.anchor.execute_short(until, query).await
            }
        })
        .await
    }

    /// Nothing taken: the row is someone else's, or nobody's but someone queues ahead (or it
    /// was handed to the caller since, or it is free and nobody queues: a lease that ran out).
    /// Takes (or keeps) a place in the queue unless there is nothing to wait for, and judges
    /// the row: what the try says (parking on the way when it may). The caller's `queued`
    /// stays set even when no place was written: the tries after a queue batch read the
    /// queue and may take the lease, and a call that ends in an error (or is dropped) with
    /// `queued` set frees a lease its token holds (see [`queue::leave_batch`]); a grant
    /// without a place costs one `DELETE` of nothing in the background.
    async fn busy(
        &self,
        request: &AcquireRequest,
        token: &LeaseToken,
        turns: (Duration, Duration),
        until: Instant,
        call: (&gate::Slot, &AtomicBool, bool),
    ) -> Result<Try, LockError> {
        let (name, gate) = (request.name(), call.0);
        let Some((state, ahead, placed)) =
            self.arrive(request, token, (turns, until), call).await?
        else {
            // The budget ran out waiting for the gate.
            return Ok(Try::Busy(None));
        };
        // No place written (nothing to wait for), and the lease taken by someone else since
        // the batch looked: a park needs a place, so queue with the next try, at once.
        if !placed
            && matches!(state, Some(LeaseState::Held { remaining_us, .. }) if remaining_us > 0)
        {
            return Ok(Try::Busy(Some(Duration::ZERO)));
        }
        // Without a park, the first two poll fast: the second is first once the first is
        // served.
        let first = ahead <= 1;
        let far = ahead >= queue::NEAR;
        let max_delay = request.backoff().max;
        let budget = request.deadline().saturating_duration_since(Instant::now());
        if let Some(foreign) = state
            .as_ref()
            .and_then(|state| state.exhausted(&self.table, name))
        {
            return Err(foreign);
        }
        let busy = |left| {
            if first {
                Try::First(left)
            } else {
                Try::Busy(left)
            }
        };
        Ok(match state {
            // A lease handed to this caller since its try (a fence above 1): it lasts only the
            // caller's turn. The next try takes it for the caller's TTL, with a fence of its
            // own. Or the row was removed in between. Either way: try again at once.
            Some(LeaseState::Held { token: held, .. }) if held == *token => {
                Try::Busy(Some(Duration::ZERO))
            }
            None => Try::Busy(Some(Duration::ZERO)),
            Some(LeaseState::Held { remaining_us, .. }) if remaining_us > 0 => {
                let left = Duration::from_micros(u64::try_from(remaining_us).unwrap_or(0));
                // The park ends when this lease runs out (see `queue::park_refresh`).
                match self.park((name, token), budget, max_delay, far, gate).await {
                    Some(woken) => Try::Parked { woken },
                    None => busy(Some(left)),
                }
            }
            // Free (released, or its lease ran out), and this caller is next: come again at
            // once.
            Some(_) if ahead == 0 => Try::Next,
            // Free, but someone else is next: wait for its turn.
            Some(_) => match self.park((name, token), budget, max_delay, far, gate).await {
                Some(woken) => Try::Parked { woken },
                None => busy(None),
            },
        })
    }

    /// Parks the caller for at most `at_most` on a pooled connection, until a release hands
    /// it the lease and wakes it (see [`queue`]): one park after another while each waits its
    /// time out (each keeps the caller's place), so a waiter in a long queue costs the server
    /// one park, two short round trips, per park length, not a try and a queue batch. A waiter
    /// `far` back ([`queue::NEAR`] or more live places ahead) parks long
    /// ([`queue::LONG_PARK`]); woken from a long park (a release brought it near the head, or
    /// handed it the lease) it parks short at once, without a try: that park does not wait if
    /// the lease is the waiter's. At most half the pool parks (see [`LeaseStrategy::new`]),
    /// so the client's renewals and releases find the other half. `None` when it did not park:
    /// no park permit free, no time to park, or no connection from the pool in time; else
    /// whether its last park was a short one a release woke. A caller holding its lock's
    /// [gate] parks on the gate's connection, with the gate's permit (a gate whose connection
    /// fails is dropped, which gives it back, and the park ends).
    async fn park(
        &self,
        (name, token): (&LockName, &LeaseToken),
        at_most: Duration,
        max_delay: Duration,
        far: bool,
        gate: &gate::Slot,
    ) -> Option<bool> {
        let end = Instant::now() + at_most;
        let next = |far: bool| {
            let longest = if far {
                queue::LONG_PARK
            } else {
                queue::PARK_MAX
            };
            end.saturating_duration_since(Instant::now()).min(longest)
        };
        if next(false) < Duration::from_millis(1) {
            return None;
        }
        // Put back into the slot when this returns (or is dropped).
        let mut gated = gate.borrow();
        let with_gate = gated.is_some();
        let _permit = if with_gate {
            None
        } else {
            let Ok(permit) = self.parking.clone().try_acquire_owned() else {
                return None;
            };
            Some(permit)
        };
        // Whether a park ran (else the caller backs off as if it had found no permit), and
        // whether the last was a short one a release woke.
        let (mut parked, mut woken_short) = (false, false);
        let (mut again, mut far) = (false, far);
        loop {
            // Each park takes its connection from the pool (and its length is set once it has
            // one): a release's wake-up and the client's other statements share the pool as
            // they did between a park and a try.
            // A gate lost on the way (its connection failed) took its permit with it.
            if with_gate && !gated.is_some() {
                break;
            }
            // Long parks wait on the anchor only: a release wakes a long parker near the head
            // as well as the waiter it hands the lease to, and kills of many `SLEEP`s at once
            // are slow (see `crate::anchor`).
            let anchor = self.anchor.name();
            let long = far && anchor.is_some();
            let (mut pooled, until) = (None, Instant::now() + next(long) + ANSWER_GRACE);
            let Some(conn) = gated.park_conn(&mut pooled, &self.pool, until).await else {
                break;
            };
            let length = next(long);
            if length < Duration::from_millis(1) {
                break;
            }
            parked = true;
            let park = queue::Park {
                length,
                again,
                long,
            };
            let place = if long {
                queue::long_place_for(max_delay)
            } else {
                queue::place_for(max_delay)
            };
            let (outcome, broken) = self
                .park_once(conn, (name, token), (park, place), anchor.as_deref())
                .await;
            if broken {
                gated.broken(&mut pooled);
            }
            let woken = match outcome {
                queue::Parked::Slept { far: still } => {
                    (again, far) = (true, still);
                    continue;
                }
                queue::Parked::Woken => true,
                // Not a park: the caller backs off.
                queue::Parked::Unmarked => {
                    parked = false;
                    break;
                }
                queue::Parked::Skipped | queue::Parked::TookAnchor => false,
            };
            if !(woken && long) {
                woken_short = woken;
                break;
            }
            // Woken from a long park: near the head now (or handed the lease).
            (again, far) = (false, false);
        }
        parked.then_some(woken_short)
    }

    /// One park on `conn` (see [`queue::park_refresh`] and [`queue::park_wait`]): how it
    /// ended, and whether `conn` must be closed. A failure to park counts as
    /// [`queue::Parked::Skipped`] (the caller tries); a `KILL QUERY` that ended the statement
    /// with an error as [`queue::Parked::Woken`]. Dropped between the refresh and the wait's
    /// answer (the caller's `acquire` future dropped), it closes `conn`, which may hold the
    /// park's marker: back in the pool, a connection holding it would take a later release's
    /// `KILL QUERY` meant for this waiter in whatever statement it then runs.
    async fn park_once(
        &self,
        conn: &mut sqlx::pool::PoolConnection<sqlx::MySql>,
        (name, token): (&LockName, &LeaseToken),
        (park, place): (queue::Park, Duration),
        anchor: Option<&str>,
    ) -> (queue::Parked, bool) {
        let (name_bytes, token_bytes) = (name.as_str().as_bytes(), token.as_str().as_bytes());
        let until = Instant::now() + park.length + ANSWER_GRACE;
        let mut marked = Marked {
            conn,
            maybe_held: true,
        };
        // Two round trips: the refresh, then the wait alone (see `queue::park_refresh`).
        let refresh = queue::park_refresh(
            &self.table,
            name_bytes,
            token_bytes,
            (park, place),
            self.limits.mariadb,
        );
        if let Err(error) = within(until, run(marked.conn, AssertSqlSafe(refresh))).await {
            tracing::debug!(lock = %name, %error, "parking failed; trying again");
            return (queue::Parked::Skipped, true);
        }
        let wait = queue::park_wait(&self.table, (name_bytes, token_bytes), park, anchor);
        match within(until, run(marked.conn, AssertSqlSafe(wait))).await {
            Ok(rows) => {
                // The statement gave the marker back.
                marked.maybe_held = false;
                match queue::Parked::read(&rows) {
                    Some(queue::Parked::TookAnchor) => {
                        if let Some(anchor) = anchor {
                            self.anchor.lost(anchor);
                        }
                        (queue::Parked::TookAnchor, false)
                    }
                    Some(parked) => (parked, false),
                    None => (queue::Parked::Skipped, false),
                }
            }
            // Woken by the release's `KILL QUERY` (the kill ended the statement before it gave
            // its marker back, so give it back now, or close the connection).
            Err(error) if classify(&error) == Class::Interrupted => {
                let unmark = queue::unmark(token_bytes, park.long);
                let until = Instant::now() + ANSWER_GRACE;
                let unmarked = within(until, run(marked.conn, AssertSqlSafe(unmark))).await;
                marked.maybe_held = unmarked.is_err();
                (queue::Parked::Woken, unmarked.is_err())
            }
            Err(error) => {
                tracing::debug!(lock = %name, %error, "parking failed; trying again");
                (queue::Parked::Skipped, true)
            }
        }
    }

    /// A busy try's queue work (see [`Self::queue_up`]); an `arriving` one (the call's first)
    /// waits for the lock's [gate] first, if it may park. `None` when the budget ran out
    /// waiting for the gate.
    ///
    /// Sets `queued` before the queue batch: a call that never sent one (its budget ran out
    /// at the gate) has no place to take out when it ends.
    async fn arrive(
        &self,
        request: &AcquireRequest,
        token: &LeaseToken,
        (turns, until): ((Duration, Duration), Instant),
        (gate, queued, arriving): (&gate::Slot, &AtomicBool, bool),
    ) -> Result<Option<Queued>, LockError> {
        let until = if arriving {
            if !self.enter_gate(request, gate).await {
                return Ok(None);
            }
            // Waiting for the gate took time: the queue batch gets its own.
            self.try_until(request)
        } else {
            until
        };
        let placing = if gate.held() {
            queue::Placing::Always
        } else {
            queue::Placing::Usual
        };
        queued.store(true, Ordering::Relaxed);
        self.queue_up(request.name(), token, (turns, until), placing)
            .await
            .map(Some)
    }

    /// Waits for the gate of the request's lock (see [`super::gate`]) and keeps it in `gate`;
    /// false when the wait budget ran out waiting for it (the caller is busy), else the caller
    /// queues (with the gate, or without it: see [`Entered::Passed`]).
    async fn enter_gate(&self, request: &AcquireRequest, gate: &gate::Slot) -> bool {
        let entered = gate::enter(
            (&self.pool, &self.parking),
            (&self.table, request.name()),
            (request.deadline(), queue::place_for(request.backoff().max)),
            (gate, self.limits.mariadb),
        )
        .await;
        entered != Entered::TimedOut
    }

    /// A busy try's queue work in one round trip (see [`queue::busy_batch`]): the judged
    /// lease row of `name` (`None` when there is none), how many waiters are ahead of
    /// `token` (0 up to [`queue::NEAR`], which stands for that many or more), and whether
    /// `token` has a place now.
    async fn queue_up(
        &self,
        name: &LockName,
        token: &LeaseToken,
        (turns, until): ((Duration, Duration), Instant),
        placing: queue::Placing,
    ) -> Result<Queued, LockError> {
        let what = || format!("queueing for `{name}`");
        let sql = queue::busy_batch(
            &self.table,
            name.as_str().as_bytes(),
            token.as_str().as_bytes(),
            turns,
            placing,
            LEASE_COLUMNS,
            self.limits.mariadb,
        );
        let batch = || retry_deadlocks(|| run_pooled(&self.pool, sql.clone(), until));
        // Once more if a release's wake-up meant for this client's park landed on the batch
        // (it found the park's marker just before the park ended).
        let rows = match batch().await {
            Err(error) if classify(&error) == Class::Interrupted => batch().await,
            other => other,
        }
        .map_err(|e| LockError::from(Error::new(what(), e)))?;
        let state = tagged(&rows, "row")
            .next()
            .map(|row| {
                LeaseRow::read(row, 1)
                    .map_err(|e| LockError::from(Error::new(what(), e)))?
                    .judge(&self.table, name)
            })
            .transpose()?;
        let (ahead, placed) = tagged(&rows, "ahead")
            .next()
            .map(|row| Ok::<_, sqlx::Error>((row.try_get::<i64, _>(1)?, row.try_get::<i64, _>(2)?)))
            .transpose()
            .map_err(|e| LockError::from(Error::new(what(), e)))?
            // No answer to read: count the caller as placed (it parks as it would have).
            .unwrap_or((0, 1));
        Ok((state, ahead, placed != 0))
    }
}

/// A park's connection while it may hold the park's marker: closed if dropped so (see
/// `LeaseStrategy::park_once`).
struct Marked<'c> {
    conn: &'c mut sqlx::pool::PoolConnection<sqlx::MySql>,
    maybe_held: bool,
}

impl Drop for Marked<'_> {
    fn drop(&mut self) {
        if self.maybe_held {
            self.conn.close_on_drop();
        }
    }
}
