//! The lease strategy's waiters' queue (`<table>_queue`), so that no client is passed over
//! indefinitely by clients that release and re-acquire, and a released lease goes to the next
//! waiter at once.
//!
//! - **Who queues here**: a waiter that may park waits for the lock's [gate](super::gate)
//!   first and queues once it holds it, so waiters of other clients are mostly one place
//!   here (the gate's holder) and the rest wait in `GET_LOCK`; waiters that cannot park (a
//!   pool of one, or half the pool parked) queue here directly. What follows holds for every
//!   place, whoever wrote it.
//! - **A place**: a waiter's busy try inserts `(name, token, arrived_at, until_at, turn_us)`
//!   when there is something to wait for (the gate's holder always), see [`busy_batch`] (the
//!   token is the one its `acquire` call uses for every try; `arrived_at` is the server's
//!   `NOW(6)` at its first busy try that writes a place) and every later try or park pushes
//!   `until_at` on by [`place_for`]: the longest a waiter sleeps between tries plus a
//!   second. `turn_us` is how long the waiter may take to come for a lease handed to it
//!   ([`turn_for`]). A place that lapsed counts for nothing; busy tries delete lapsed places
//!   once they are at the head of the queue, so a waiter that was paused past its place and
//!   comes back before then keeps its old rank.
//! - **Locks**: a busy try's statements lock only places found by their key (the head of the
//!   queue, its own place, and the first waiter's when it cuts that to its turn), never the
//!   lease and then a place, so tries of many waiters do not wait on each other's refreshes
//!   or deadlock (fault case `lease/a_locked_place_behind_stalls_no_waiter`). The lease row
//!   only in one case, in a statement of its own: a lease released while nobody queued,
//!   which the try marks (see [`busy_batch`]).
//! - **Who may take a free lease**: while any live place exists, only the first (by
//!   `arrived_at`, then token) may take it; anybody else, including the client that just
//!   released, finds it busy and takes a place at the back (the place of the lease's own
//!   holder, whose removal may come late, counts for nothing). The condition ([`allowed`]) is
//!   part of the acquire statement of every try after the first (a caller with a place, or
//!   one whose queue batch found nothing to wait for). A call's first try (no place
//!   yet) does not read the queue: it takes only a lease released while nobody queued (a
//!   release that saw no live place leaves `acquired_at` NULL, and a busy try that writes a
//!   place and then finds the lease so marks it, see [`busy_batch`]), so a client nobody
//!   waits behind still acquires in one round trip. The order so holds among waiters whose
//!   places the release could see; a place written while a release that saw none was
//!   committing (the release read the queue, then its commit took a moment) may be passed
//!   once by a newcomer; every later release sees it. So may a caller whose queue batch
//!   wrote no place (the lease was free and nobody else queued: just released, or a waiter
//!   back from a pause whose place lapsed), until its next batch finds the lease held.
//! - **Direct hand-off**: release gives the lease to the first live waiter in the same step
//!   ([`release_batch`]): its token, a fence one higher, and an expiry of that waiter's turn;
//!   then it wakes the waiter (below). A release that freed the lease without handing it over
//!   (its read of the queue, a plain one, came before the first waiter's place was written)
//!   looks again once committed and wakes the first live waiter it finds then: that waiter may
//!   have parked after its place was written and before the release committed, seeing the
//!   lease still held. The waiter's next try finds the lease held by its own
//!   token and takes it for its TTL with a fence one higher again (the acquire statement's
//!   "taken" rule covers its own token). A waiter that died or is paused lets the handed
//!   lease expire after its turn (1.1 s with the default back-off), and its place lapses
//!   with it.
//! - **Waking the waiter**: between tries a waiter parks on a pooled connection: one batch
//!   refreshes its place ([`park_refresh`]; it records the connection, for operators), then
//!   one statement waits, only if the lease has not been handed to it yet ([`park_wait`]): in
//!   `GET_LOCK` on the client's [anchor](crate::anchor) (a user lock the client holds on a
//!   connection of its own, so the wait never ends by itself before its timeout), or in
//!   `SLEEP` without one. The wait is one statement of its own because MariaDB ends a batch
//!   killed between two statements without the rest of its answer, and in `GET_LOCK` because
//!   a killed `SLEEP` waits for a mutex every sleeping session shares (see
//!   [`crate::anchor`]); either made a woken waiter stall for up to 2 s. While it waits, the
//!   connection holds a user lock named after the waiter's token (its *marker*), taken by the
//!   refresh's last statement, before the wait's statement begins. The release, *after*
//!   handing the lease over, finds the session holding the waiter's marker (`IS_USED_LOCK`)
//!   and sends it `KILL QUERY`, which ends the wait. A kill that lands before the wait's
//!   statement starts is lost (or stops that statement), but that statement starts after the
//!   kill, so after the hand-off was committed, which it then sees: it does not wait. (The
//!   marker was once taken inside the wait's statement, first; but MariaDB reads a
//!   primary-key lookup of a statement while it plans it, before any of the statement runs,
//!   so the wait's checks could read the lease before a release committed and the marker be
//!   taken after that release looked for it: nobody woke the waiter, which slept its park
//!   out, up to [`PARK_MAX`], with the lease handed to it; fault case
//!   `lease/a_release_wakes_a_waiter_parking_just_then`.)
//! - **Short and long parks**: a park that waited its time out is followed at once by another,
//!   which keeps the place alive and tries nothing unless the lease was handed over or became
//!   free. A waiter near the head (fewer than [`NEAR`] live places ahead) parks at most
//!   [`PARK_MAX`], the holder's time left and until the first live place ahead lapses: it
//!   sees to dead holders and dead waiters ahead. A waiter further back parks up to
//!   [`LONG_PARK`] (on the anchor only), and each release wakes the long parks of the second
//!   and third live waiters too (near the head now), so they park short from then on: a dead
//!   first waiter stalls the lock for its turn, two in a row for two turns, and three or more
//!   dead or paused waiters in a row may add one long park (this assumes the wake-ups work:
//!   they need the privilege below). While the lease is held, a waiter far back
//!   so costs the server one park (two short round trips) per [`LONG_PARK`], not a try and a
//!   queue batch a second (a thousand waiters parking a second at a time kept the server
//!   busy with about 5,500 statements a second, and it granted almost nothing). Reads a park
//!   makes of the lease and of others' places are plain `SELECT`s (into variables), but for
//!   one look of the waiter at the head that skips a locked row (see [`park_refresh`]): a
//!   waiter never waits for the lease row's lock, and holds it up for one statement at most.
//!   At most half the pool's
//!   connections park at once (the others stay free for renewals; a pool of one connection
//!   never parks); a waiter that finds none polls instead (the first two every 1 to
//!   [`FIRST_POLL_MAX`] ms, the others with their back-off). Killing another session's query
//!   needs the same database user (or the privilege); without it the wake fails quietly and
//!   the waiter finds the lease at the end of its park.
//! - **A free lease nobody came for** (expired, or released before anyone queued): a busy try
//!   that finds it free while someone else is first cuts that place to the first waiter's
//!   own turn from then.
//! - **Leaving**: a waiter that gives up (budget spent, error) deletes its place and frees a
//!   lease handed to it meanwhile, before it answers if the server does that within a moment
//!   (else in the background, so the answer is on time); one whose `acquire` future is
//!   dropped does the same in the background. That clean-up does not wait for a queue batch
//!   of the dropped call still in flight, so a place written just after it is left to lapse
//!   (after at most [`place_for`]; a handed lease after its turn). A parked waiter behind such
//!   a place wakes when it lapses (see [`park_refresh`]).
//!
//! The queue only decides who may take a free lease; a lease handed over is an ordinary lease
//! row. A lost or stale place can delay a waiter but never grant a lock twice.

use std::time::Duration;

use crate::{
    TableName,
    rows::{LEASE_RELEASED_ALONE, LEASE_TAKEABLE},
    sql::hex,
};

/// The margin of a waiter's turn beyond its longest sleep.
pub(crate) const HANDOFF: Duration = Duration::from_millis(100);

/// The longest a first waiter that could not park sleeps between tries.
pub(crate) const FIRST_POLL_MAX: Duration = Duration::from_millis(40);

/// The longest one park lasts for a waiter near the head of the queue (fewer than [`NEAR`]
/// live places ahead of it).
pub(crate) const PARK_MAX: Duration = Duration::from_secs(1);

/// The longest one park lasts for a waiter far back ([`NEAR`] or more live places ahead): the
/// release that brings it near the head wakes it (see [`release_batch`]), so its length costs
/// no waiting; it sets how often a thousand waiters far back keep their places alive.
pub(crate) const LONG_PARK: Duration = Duration::from_secs(5);

/// Waiters with fewer live places than this ahead of them park short ([`PARK_MAX`]); the
/// others park long ([`LONG_PARK`]).
pub(crate) const NEAR: i64 = 3;

/// How long a waiter has to come for a lease handed to it (or left free for it): the longest
/// it may be asleep (`max_delay`, its back-off maximum, or a park) plus [`HANDOFF`].
pub(crate) fn turn_for(max_delay: Duration) -> Duration {
    max_delay.max(PARK_MAX) + HANDOFF
}

/// How long a place lasts after a try or a park: the waiter's longest sleep between tries
/// (`max_delay`, its back-off maximum, or a park) plus a second.
pub(crate) fn place_for(max_delay: Duration) -> Duration {
    max_delay.max(PARK_MAX) + Duration::from_secs(1)
}

/// How long a place lasts after a long park: the park plus a second, at least
/// [`place_for`].
pub(crate) fn long_place_for(max_delay: Duration) -> Duration {
    place_for(max_delay).max(LONG_PARK + Duration::from_secs(1))
}

/// How long the first waiter sleeps after its `streak`-th try in a row as first: 1, 2, 4 ms
/// ... up to [`FIRST_POLL_MAX`].
pub(crate) fn first_delay(streak: u32) -> Duration {
    Duration::from_millis(1u64 << streak.min(6)).min(FIRST_POLL_MAX)
}

/// The SQL condition, in the acquire statement on the lease table `table`, "no live place of
/// its queue comes before the caller's": the caller (`token`) has no place and nobody
/// queues, or its place is the first live one. Four placeholders: name, token, token, token.
///
/// The place of the lease's own holder (the row's token) counts for nothing, unless it is the
/// caller's: that waiter was served. (The caller's own place always counts: once the statement has
/// written the caller's token into the row, later assignments that test this condition again must
/// stop at the caller's place, not read, and lock, the places behind it; fault case
/// `lease/a_locked_place_behind_stalls_no_waiter`.) A holder that queued before its grant takes its
/// place out in the background (or its release does); if its lease ends first (it ran out, or the
/// holder died before the removal ran), the place must not keep the lease from the next acquirer
/// (fault case `lease/own_place_blocks_nobody_after_expiry`).
///
/// It reads the queue from its head (index `by_arrival`) to the first live place, no further:
/// in the acquire statement it is a locking read, and a condition that read every place (as
/// it did before) locked every waiter's row on every try, so with a thousand waiters tries
/// waited on each other's place refreshes and InnoDB rolled them back as deadlocks.
pub(crate) fn allowed(table: &TableName) -> String {
    let (t, q) = (table.quoted(), table.queue().quoted());
    format!(
        "COALESCE((SELECT o.token FROM {q} o FORCE INDEX (by_arrival) WHERE o.name = ? AND o.until_at > NOW(6) \
         AND (o.token = ? OR NOT (o.token <=> {t}.token)) ORDER BY o.arrived_at, o.token LIMIT 1), ?) = ?"
    )
}

/// One busy try's queue work, in one round trip (each statement autocommitted). Every
/// statement that locks touches rows found by their key, never a range of the queue: a try
/// must not wait for the places of other waiters (a thousand of them refresh theirs all the
/// time), and no statement locks a place and then the lease while an acquire locks them the
/// other way round. The places it needs are read first without locks (plain `SELECT`s into
/// variables, reading the queue from its head along `by_arrival`), and so is whether the
/// lease is free: `SELECT .. INTO @v`, never `SET @v = (SELECT ..)`, which MariaDB runs as a
/// locking read (it waits for, and then blocks, the row an acquisition or a release is
/// writing; seen as hundreds of sessions in state `Statistics` on that read with a thousand
/// waiters):
///
/// - delete the place at the head of the queue if it lapsed (a waiter that died; one per
///   try: lapsed places further back are ignored by every rule, which reads live places only,
///   and are deleted once they reach the head). Whether it lapsed is read first, without a
///   lock, into a variable the `DELETE`'s condition tests: while the head is live the
///   condition is false before any row is read (the optimizer's "impossible WHERE"), so the
///   head's row is not locked. (A `DELETE` that tested only `until_at` locked the head's row
///   whether it lapsed or not; with a thousand waiters, every try of every waiter queued on
///   that one row lock, and the server, at 193 % CPU, took minutes to get through them:
///   fault case `lease/a_locked_head_stalls_no_newcomer`);
/// - take or keep the caller's place for `place` with its `turn`, as `placing` says: a caller
///   holding the lock's gate always ([`Placing::Always`]; a lease released meanwhile then
///   goes to it, not to a newcomer's first try), others ([`Placing::Usual`]) unless there is
///   nothing to wait for: the lease is free and no live place other than its holder's exists
///   (a lease
///   that ran out, or one freed while someone queued who has gone; a call's first try does
///   not take these, see above): then the caller takes it with its next try, which
///   reads the queue, without having written a place (outcome case
///   `lease/acquire_answer_matches_the_row`). Read first without a lock, like the head;
/// - if the lease was released while nobody queued (a release that ran just before the place
///   was written, [`LEASE_RELEASED_ALONE`]), mark it freed while someone queues
///   (`acquired_at` set), so the first try of a newcomer, which does not read the queue, no
///   longer takes it (read first without a lock: the lease row is locked only then);
/// - cut the first waiter's place to its own turn when the lease is free and the first is
///   someone else;
/// - read the lease row (`'row'`, [`LEASE_COLUMNS`](crate::rows::LEASE_COLUMNS)) and how
///   many live places come before the caller's (`'ahead'`: 0 up to [`NEAR`], which stands for
///   that many or more; counted from the head, so a try reads a few places whatever the
///   length of the queue), and whether the caller has a place (live or not) now.
pub(crate) fn busy_batch(
    table: &TableName,
    name: &[u8],
    token: &[u8],
    (place, turn): (Duration, Duration),
    placing: Placing,
    columns: &str,
    mariadb: bool,
) -> String {
    let t = table.quoted();
    let q = table.queue().quoted();
    let (n, k) = (hex(name), hex(token));
    let place = place.as_micros();
    let turn = turn.as_micros();
    format!(
        "SET @lm_head = NULL, @lm_lapsed = 0, @lm_first = NULL, @lm_wait = 1; \
         SELECT token, until_at <= NOW(6) INTO @lm_head, @lm_lapsed FROM {q} FORCE INDEX (by_arrival) \
         WHERE name = {n} ORDER BY arrived_at, token LIMIT 1; \
         DELETE FROM {q} WHERE name = {n} AND token = @lm_head AND @lm_lapsed AND until_at <= NOW(6); \
         {wait}\
         {insert}\
         SET @lm_alone = 0; \
         SELECT 1 INTO @lm_alone FROM {t} WHERE name = {n} AND @lm_wait AND {LEASE_RELEASED_ALONE}; \
         UPDATE {t} SET acquired_at = NOW(6) WHERE name = {n} AND @lm_alone AND {LEASE_RELEASED_ALONE}; \
         SELECT token INTO @lm_first FROM {q} FORCE INDEX (by_arrival) \
         WHERE name = {n} AND until_at > NOW(6) ORDER BY arrived_at, token LIMIT 1; \
         SELECT EXISTS (SELECT 1 FROM {t} WHERE name = {n} AND {LEASE_TAKEABLE}) INTO @lm_free; \
         UPDATE {q} SET until_at = LEAST(until_at, NOW(6) + INTERVAL turn_us MICROSECOND) \
         WHERE name = {n} AND token = @lm_first AND @lm_first <> {k} AND @lm_free; \
         SELECT 'row', {columns} FROM {t} WHERE name = {n}; \
         SELECT 'ahead', {ahead}, EXISTS (SELECT 1 FROM {q} WHERE name = {n} AND token = {k})",
        wait = match placing {
            Placing::Usual => format!(
                "SELECT NOT EXISTS (SELECT 1 FROM {t} WHERE name = {n} AND {LEASE_TAKEABLE}) \
                 OR EXISTS (SELECT 1 FROM {q} o FORCE INDEX (by_arrival) WHERE o.name = {n} \
                 AND o.until_at > NOW(6) \
                 AND NOT (o.token <=> (SELECT l.token FROM {t} l WHERE l.name = {n}))) \
                 INTO @lm_wait; "
            ),
            Placing::Always => "SET @lm_wait = 1; ".to_owned(),
        },
        ahead = ahead((&t, &q), &n, &k, NEAR),
        // Sent only if there is something to wait for. Not `INSERT .. SELECT .. WHERE
        // @lm_wait ON DUPLICATE KEY UPDATE`, which a server logging statements (binlog_format
        // STATEMENT) takes as unsafe to replicate and warns of on every try.
        insert = run_if(
            "lm_place",
            &format!(
                "IF(@lm_wait, {}, 'DO 0')",
                text_literal(&format!(
                    "INSERT INTO {q} (name, token, arrived_at, until_at, turn_us) \
                     VALUES ({n}, {k}, NOW(6), NOW(6) + INTERVAL {place} MICROSECOND, {turn}) \
                     ON DUPLICATE KEY UPDATE until_at = NOW(6) + INTERVAL {place} MICROSECOND"
                ))
            ),
            mariadb
        ),
    )
}

/// When a busy batch writes the caller's place (see [`busy_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placing {
    /// When there is something to wait for.
    Usual,
    /// Always: the caller holds the lock's gate (see [`super::gate`]).
    Always,
}

/// `sql` as an SQL string literal (its quotes doubled).
fn text_literal(sql: &str) -> String {
    format!("'{}'", sql.replace('\'', "''"))
}

/// The longest park of a waiter at the head of the queue that found a write of the lease row
/// in flight (see [`park_refresh`]): a release that then commits wakes nobody, so the waiter
/// looks again this soon.
pub(crate) const WRITTEN_PARK: Duration = Duration::from_millis(20);

/// The label a park's waiting statement carries, followed by the waiter's token (for
/// whoever reads the server's process list).
const PARK_MARK: &str = "lock-mysql park ";

/// The user lock a waiting statement holds while it waits (see [`park_wait`]): this
/// followed by the waiter's token, or by [`LONG_MARK`] and the token for a long park.
const MARKER: &str = "lock-mysql/wait/";

/// The marker user lock of the park of `token`.
fn marker(token: &[u8], long: bool) -> String {
    format!(
        "{MARKER}{}{}",
        if long { LONG_MARK } else { "" },
        token_text(token)
    )
}

/// The statement that gives the marker of a park killed in `SLEEP` back (a `SLEEP` killed
/// inside a larger statement ends it with an error, before it gave its marker back).
pub(crate) fn unmark(token: &[u8], long: bool) -> String {
    format!("DO RELEASE_LOCK('{}')", marker(token, long))
}

/// A token as the text it is (tokens of this library are 32 lowercase hex digits; anything
/// else is written hex-escaped, and then no release matches it).
fn token_text(token: &[u8]) -> String {
    match std::str::from_utf8(token) {
        Ok(text) if text.bytes().all(|b| b.is_ascii_hexdigit()) => text.to_owned(),
        _ => hex(token).replace('\'', ""),
    }
}

/// How many live places of the queue `q` come before the caller's (`k`) on the name `n`,
/// counted from the head along `by_arrival` up to `limit` (which stands for that many or
/// more): a few index entries, whatever the length of the queue. 0 when the caller has no
/// place. The place of the lease's own holder (the token of the row in `t`, read without a
/// lock) does not count, as in [`allowed`]. One parenthesised SQL expression.
fn ahead((t, q): (&str, &str), n: &str, k: &str, limit: i64) -> String {
    format!(
        "(SELECT COUNT(*) FROM (SELECT 1 FROM {q} o FORCE INDEX (by_arrival) \
         WHERE o.name = {n} AND o.until_at > NOW(6) \
         AND (o.arrived_at, o.token) < (SELECT arrived_at, token FROM {q} WHERE name = {n} AND token = {k}) \
         AND NOT (o.token <=> (SELECT l.token FROM {t} l WHERE l.name = {n})) \
         ORDER BY o.arrived_at, o.token LIMIT {limit}) AS ahead)"
    )
}

/// Deletes the caller's place.
pub(crate) fn leave_place(table: &TableName, name: &[u8], token: &[u8]) -> String {
    format!(
        "DELETE FROM {} WHERE name = {} AND token = {}",
        table.queue().quoted(),
        hex(name),
        hex(token)
    )
}

/// Deletes the caller's place and frees a lease handed to it that it did not take. Whether
/// one was handed to it is read first without a lock: the `UPDATE` then locks the lease row
/// only if so (its condition is constant-false otherwise), so a waiter giving up does not wait
/// for the lease row's lock held by others (fault case
/// `lease/a_leaving_waiter_leaves_the_lease_row_alone`; at the end of a run of a thousand
/// waiters, 767 sessions at once waited in an `UPDATE` of the lease row that began as this
/// one's did).
///
/// Leaving brings the waiters behind nearer the head, as a release does: it then wakes the
/// long parks of the first [`NEAR`] live waiters, so they park short and see to a lease
/// nobody comes for. (Without it, in the fault campaign, whose waiters give up every 2 s, the
/// waiters near the head all left while those behind slept long parks, and the free lock
/// stalled for up to 9.4 s; fault case `lease/waiters_leaving_wake_a_long_parker`.)
pub(crate) fn leave_batch(table: &TableName, name: &[u8], token: &[u8], mariadb: bool) -> String {
    let (t, q) = (table.quoted(), table.queue().quoted());
    let (n, k) = (hex(name), hex(token));
    let nth = |var: &str, offset: usize| {
        format!(
            "SELECT token INTO {var} FROM {q} FORCE INDEX (by_arrival) \
             WHERE name = {n} AND until_at > NOW(6) ORDER BY arrived_at, token LIMIT 1 OFFSET {offset}; "
        )
    };
    let long =
        |var: &str| format!("IS_USED_LOCK(CONCAT('{MARKER}{LONG_MARK}', CAST({var} AS CHAR)))");
    format!(
        "DELETE FROM {q} WHERE name = {n} AND token = {k}; \
         SET @lm_handed = 0; \
         SELECT 1 INTO @lm_handed FROM {t} WHERE name = {n} AND token = {k}; \
         UPDATE {t} SET token = NULL, expires_at = NULL \
         WHERE name = {n} AND token = {k} AND @lm_handed; \
         SET @lm_w1 = NULL, @lm_w2 = NULL, @lm_w3 = NULL; {w1}{w2}{w3}\
         SET @lm_k1 = {k1}, @lm_k2 = {k2}, @lm_k3 = {k3}; {kills}",
        w1 = nth("@lm_w1", 0),
        w2 = nth("@lm_w2", 1),
        w3 = nth("@lm_w3", 2),
        k1 = long("@lm_w1"),
        k2 = long("@lm_w2"),
        k3 = long("@lm_w3"),
        kills = kills(
            &[
                ("@lm_k1", "FALSE"),
                ("@lm_k2", "@lm_k2 = @lm_k1"),
                ("@lm_k3", "@lm_k3 = @lm_k1 OR @lm_k3 = @lm_k2"),
            ],
            mariadb
        ),
    )
}

/// The first of a waiter's park's two round trips: record this connection in its place and
/// keep the place for `place` (the park's own refresh: a waiter parks `again` after a park
/// that slept, without a try or a queue batch, see [`Parked`]), read the waiter's own lease
/// and how long it may wait, and cut its place to a lease handed to it. Leaves its readings
/// in session variables for [`park_wait`], on the same connection. A place cut to the turn of
/// a lease handed to it stays cut: after the refresh the park reads the waiter's own lease and
/// cuts the place to that lease's expiry (a release commits its hand-off together with its cut,
/// so a refresh that overwrites the cut waited for that commit and sees the hand-off).
/// It also reads how many live places are ahead (0 up to [`NEAR`]). For a waiter near the
/// head the wait lasts at most `park` (and [`PARK_MAX`]) and ends sooner when the lease of
/// another holder runs out (a holder that died) and when the first live place of someone else
/// lapses (a waiter that died, or a place left behind by an `acquire` dropped while it was
/// being written; fault case `lease/a_lapsing_place_ahead_stalls_only_until_it_lapses`). A
/// long park of a waiter still far back waits its whole length (see [`park_wait`]).
///
/// Every read but one is a plain `SELECT` (into variables), which takes no lock: MariaDB runs
/// `SET @v = (SELECT ..)` as a locking read, and a park must not wait for, nor hold up, the
/// lease row's lock. The one: the waiter at the head of the queue (no live place ahead; the
/// variable is read first, so for the waiters further back the statement's condition is false
/// before any row is read; a caller without a place reads too, and does not wait anyway)
/// looks whether a write of the lease row is in flight, with a locking read that skips a
/// locked row (`SKIP LOCKED`, so it waits for nothing; its shared lock lasts the statement):
/// then its park lasts at most [`WRITTEN_PARK`], and the next park reads what that write
/// left. A lone release ([`release_alone`]) reads the queue without a lock, so it can miss a
/// place committed after its read and free the lease, waking nobody, while the waiter of that
/// place reads the lease as still held (the release has not committed) and parks: without
/// this look the waiter slept its park out (fault case
/// `lease/a_lone_release_wakes_a_waiter_parked_before_its_commit`: a second, every run). A
/// release that locks the lease row only after this look reads the queue once it has the
/// row, so after this look, and sees the place, written before this batch (shown by hand on
/// MariaDB 10.11: such an update that waited for the row's lock while a place was committed
/// found the place once it had the lock, and changed nothing). A release batch reads the
/// queue before it locks the row, and looks again after its commit (see [`release_batch`]).
/// Its last statement takes the park's marker (without waiting; see [`park_wait`]), so that every
/// read of the wait's statement comes after the marker is held. Until that last statement the batch
/// holds no marker, so no release's `KILL QUERY` is aimed at it between two of its statements:
/// MariaDB ends a batch killed there without the rest of its answer, though the answer before said
/// more would follow, and the client would wait for it until its own time limit (fault case
/// `lease/park_killed_between_statements`). A kill that lands on the last statement fails the batch
/// (the park ends as if it had not waited: the connection is closed, which gives the marker back,
/// and the waiter tries); one that lands after it, before the wait's statement, is lost or stops
/// that statement, and either way the wait sees the hand-off. (A kill sent just as the waiter's
/// previous wait gave its marker back can still land here: the release looks the marker up and
/// kills in two statements. Rare; this park then ends at its time limit, the park's length and 250
/// ms, which can be longer than the waiter's turn: a waiter handed the lease then may miss its turn
/// and queue again. The same holds for a busy batch, and for a release batch, which keeps the lease
/// row locked meanwhile: see [`release_batch`].) It first gives back this waiter's markers, should
/// a failed statement have left one. `mariadb` picks the look's syntax: MariaDB has no `FOR SHARE`,
/// and MySQL takes `SKIP LOCKED` only after `FOR SHARE` or `FOR UPDATE`.
pub(crate) fn park_refresh(
    table: &TableName,
    name: &[u8],
    token: &[u8],
    (park, place): (Park, Duration),
    mariadb: bool,
) -> String {
    let (t, q) = (table.quoted(), table.queue().quoted());
    let (n, k) = (hex(name), hex(token));
    let place = place.as_micros();
    let mark = marker(token, park.long);
    let left = |until: &str| {
        format!("GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), {until}), 0) / 1000000 + 0.001")
    };
    let longest = park.length.min(PARK_MAX);
    format!(
        "DO RELEASE_LOCK('{short}'), RELEASE_LOCK('{long}'); \
         UPDATE {q} SET connection_id = CONNECTION_ID(), \
         until_at = NOW(6) + INTERVAL {place} MICROSECOND WHERE name = {n} AND token = {k}; \
         SET @lm_placed = ROW_COUNT(); \
         SELECT (SELECT expires_at FROM {t} WHERE name = {n} AND token = {k}), LEAST({park}, \
         COALESCE((SELECT {place_left} FROM {q} o FORCE INDEX (by_arrival) \
         WHERE o.name = {n} AND o.until_at > NOW(6) AND o.token <> {k} \
         ORDER BY o.arrived_at, o.token LIMIT 1), {park}), \
         COALESCE((SELECT {lease_left} FROM {t} WHERE name = {n} AND token IS NOT NULL \
         AND token <> {k} AND expires_at > NOW(6)), {park})), \
         {ahead} INTO @lm_mine, @lm_sleep, @lm_ahead; \
         UPDATE {q} SET until_at = LEAST(until_at, @lm_mine) \
         WHERE name = {n} AND token = {k} AND @lm_mine IS NOT NULL; \
         SELECT IF(@lm_ahead = 0 AND COUNT(*) = 0, LEAST(@lm_sleep, {written}), @lm_sleep) \
         INTO @lm_sleep FROM {t} WHERE name = {n} AND @lm_ahead = 0 {shared} SKIP LOCKED; \
         DO GET_LOCK('{mark}', 0)",
        place_left = left("o.until_at"),
        lease_left = left("expires_at"),
        park = format_args!("{}.{:06}", longest.as_secs(), longest.subsec_micros()),
        written = format_args!(
            "{}.{:06}",
            WRITTEN_PARK.as_secs(),
            WRITTEN_PARK.subsec_micros()
        ),
        ahead = ahead((&t, &q), &n, &k, NEAR),
        shared = if mariadb {
            "LOCK IN SHARE MODE"
        } else {
            "FOR SHARE"
        },
        short = marker(token, false),
        long = marker(token, true),
    )
}

/// The second of a park's round trips, one statement (the one a release's `KILL QUERY`
/// stops: see [`park_refresh`]): wait as long as [`park_refresh`] found, unless the place is
/// gone, or the lease has been handed to the waiter meanwhile, or the lease is free and
/// either this waiter is first (a release that freed it without seeing the place, which came
/// just after, wakes nobody) or the park comes `again` (the lease became free while it slept:
/// nobody came for a lease handed over, or a holder's lease ran out; a try sorts out who takes
/// it, cutting a first waiter's place that nobody refreshes to its turn, and the park after
/// that try sleeps until that place lapses rather than trying again at once).
///
/// A `long` park (the waiter was far back when last seen, see [`Park`]) of a waiter still
/// far back waits its whole `length` (up to [`LONG_PARK`]): the waiters near the head see to
/// dead holders and dead waiters, and a thousand waiters far back must not all wake when one
/// lease runs out; the release that brings it near the head wakes it ([`release_batch`]);
/// its statement says it is long, so that release can tell. Other parks wait what
/// [`park_refresh`] found.
///
/// It waits in `GET_LOCK` on the client's `anchor` (see [`crate::anchor`]: a `SLEEP` is slow
/// to kill when many sessions sleep), or in `SLEEP` without one. While it waits it holds its
/// *marker*, a user lock named after the waiter's token (and whether the park is long), which
/// [`park_refresh`] took, in a statement before this one, so that every read here comes after
/// it (MariaDB reads a primary-key lookup while it plans a statement, before the statement's
/// first expression runs). If the connection does not hold it (another session does: a park
/// of this waiter on another connection that has not given it back), it does not wait. It
/// gives the marker back last: a release finds the connection to wake with `IS_USED_LOCK` of
/// the marker, a lookup, where it read `information_schema.PROCESSLIST` before (which copies
/// every session's statement: with a thousand parked waiters each release spent its time
/// "Filling schema table"). Answers `'parked'` with what [`Parked::read`] reads, and the
/// count of live places ahead [`park_refresh`] read. ([`park_refresh`] gives back this
/// waiter's markers first: a marker left behind by a statement that failed must not make a
/// later release kill another statement of that connection.)
pub(crate) fn park_wait(
    table: &TableName,
    (name, token): (&[u8], &[u8]),
    park: Park,
    anchor: Option<&str>,
) -> String {
    let (t, q) = (table.quoted(), table.queue().quoted());
    let (n, k) = (hex(name), hex(token));
    // Whether the waiter is still far back is counted here, after the marker is taken (a
    // release that brought it near and found no long marker came before this count).
    let seconds = format!(
        "IF({} AND {} >= {NEAR}, {}.{:06}, @lm_sleep)",
        u8::from(park.long),
        ahead((&t, &q), &n, &k, NEAR),
        park.length.as_secs(),
        park.length.subsec_micros()
    );
    // 0: waited its time out; 2: stopped (a kill); 3: took the anchor (given back at once).
    let wait = match anchor {
        Some(a) => {
            format!("IF(GET_LOCK('{a}', {seconds}) = 0, 0, IF(RELEASE_LOCK('{a}') = 1, 3, 2))")
        }
        None => format!("IF(SLEEP({seconds}) = 0, 0, 2)"),
    };
    // The marker held (4: it was not, nothing waited), then whether to wait, then the wait,
    // then the marker back: a release that commits its hand-off and then finds no marker came
    // before the refresh took it, so before this statement's reads, which see the hand-off.
    let m = marker(token, park.long);
    format!(
        "SELECT 'parked', CAST(IF(NOT (IS_USED_LOCK('{m}') <=> CONNECTION_ID()), 4, IF(@lm_placed = 0 \
         OR EXISTS (SELECT 1 FROM {t} WHERE name = {n} AND token = {k}) \
         OR (NOT EXISTS (SELECT 1 FROM {t} WHERE name = {n} AND token IS NOT NULL AND expires_at > NOW(6)) \
         AND ({again} OR {first} = 0)), \
         1, {wait}) + 0 * COALESCE(RELEASE_LOCK('{m}'), 0)) AS SIGNED) AS woke, @lm_ahead, \
         '{PARK_MARK}{kind}{}' AS mark",
        token_text(token),
        again = u8::from(park.again),
        first = ahead((&t, &q), &n, &k, 1),
        kind = if park.long { LONG_MARK } else { "" },
    )
}

/// What follows [`PARK_MARK`] in a long park's statement, before the token.
const LONG_MARK: &str = "long ";

/// One park's settings (see [`park_wait`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Park {
    /// The longest it waits: the waiter's wait budget left, and [`PARK_MAX`] or, for a long
    /// park, [`LONG_PARK`].
    pub(crate) length: Duration,
    /// Whether it follows a park that waited its time out.
    pub(crate) again: bool,
    /// Whether the waiter was far back when last seen (at least [`NEAR`] live places ahead).
    pub(crate) long: bool,
}

/// How a park ended (the answer of [`park_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Parked {
    /// It waited its time out: the waiter parks again at once (the next park checks again
    /// all that would make it try), a long park if it is `far` back (at least [`NEAR`] live
    /// places ahead).
    Slept {
        /// Whether the waiter was far back.
        far: bool,
    },
    /// It did not wait (the lease was handed over or is free for the waiter, or the place is
    /// gone): the waiter tries.
    Skipped,
    /// A `KILL QUERY` stopped it: a release handed the waiter the lease, or, for a long
    /// park, brought the waiter near the head.
    Woken,
    /// It took the anchor, whose connection has ended (and gave it back): the waiter tries,
    /// and the anchor is reported lost.
    TookAnchor,
    /// Its marker was held by another session (see [`park_wait`]), so it did not wait: the
    /// waiter backs off as if it could not park.
    Unmarked,
}

impl Parked {
    /// Reads the answer of [`park_wait`]; `None` when it has none.
    pub(crate) fn read(rows: &[sqlx::mysql::MySqlRow]) -> Option<Self> {
        use sqlx::Row;
        let row = crate::sql::tagged(rows, "parked").next()?;
        let woke = row.try_get::<i64, _>(1).ok()?;
        Some(match woke {
            0 => Self::Slept {
                far: row
                    .try_get::<Option<i64>, _>(2)
                    .ok()
                    .flatten()
                    .is_some_and(|ahead| ahead >= NEAR),
            },
            1 => Self::Skipped,
            3 => Self::TookAnchor,
            4 => Self::Unmarked,
            _ => Self::Woken,
        })
    }
}

/// The release when nobody queues: one prepared statement that frees the lease only if it is
/// current and no live place exists (placeholders: name, token, fence, name); else nothing changes
/// and [`release_batch`] runs. It leaves the row released while nobody queued (`acquired_at` NULL
/// too, [`LEASE_RELEASED_ALONE`](crate::rows::LEASE_RELEASED_ALONE)), which the first try of the
/// next `acquire` takes without reading the queue. A place of the releasing holder counts too: it
/// queued before its grant and takes its place out in the background, so the place may outlive the
/// hold, and a newcomer would find it ahead of itself; [`release_batch`] takes it out.
///
/// It wakes nobody. A place committed after its read of the queue and before its own commit
/// (pooled connections run at `READ COMMITTED`, where that read takes no lock) is missed; the
/// waiter of that place, at the head of the queue, finds the lease row locked by this
/// statement when it parks, so it parks only briefly (see [`park_refresh`]), sees the lease
/// free and tries. (A release after waiting, [`release_batch`], looks again once committed;
/// this one does not, to stay one statement.)
pub(crate) fn release_alone(table: &TableName) -> String {
    format!(
        "UPDATE {} SET token = NULL, expires_at = NULL, acquired_at = NULL, \
         fence = LAST_INSERT_ID(fence) \
         WHERE name = ? AND {} AND NOT EXISTS (SELECT 1 FROM {} q \
         WHERE q.name = ? AND q.until_at > NOW(6))",
        table.quoted(),
        crate::rows::lease_current("?", "?"),
        table.queue().quoted()
    )
}

/// Release with hand-off: take the releasing holder's own place out (see [`release_alone`]);
/// if the lease of `token` with `fence` is current, give it to the first live waiter (its
/// token, the fence plus one, its turn), or free it if nobody waits (released while nobody
/// queued, as [`release_alone`] leaves it); cut that waiter's place
/// to its turn; then wake it with `KILL QUERY` on the session that holds its park's marker
/// (see [`park_wait`]), and wake the next live waiters up to the [`NEAR`]th too if they wait
/// in a long park: they are near the head now (once the first takes its place out), and a
/// park near the head must end when the lease just handed over runs out, should its waiter
/// be dead (so that two dead waiters in a row stall the lock for their two turns, not for a
/// long park: fault case `lease/a_long_parker_near_the_head_wakes_at_the_release`). Each
/// release brings one waiter near, so that costs one wake-up and one park per hand-off.
///
/// The first waiter is chosen by a plain read, which can miss a place committed just after
/// it and before the lease row's update (whose own read of the queue, later, sees it and
/// keeps the lease marked as released while someone queued): the lease is then freed, not
/// handed over.
/// That waiter may already be parked, having seen the lease held before this commit, and
/// nothing else wakes it before its park ends (up to [`PARK_MAX`]). So a release that freed
/// the lease reads the queue again after its commit and wakes the first live waiter (whose
/// park took its marker before it read the lease, see [`park_wait`], so a park that saw the
/// lease held holds its marker by then). With 16 clients on one lock for 8 s, a waiter
/// slept a whole park in 7 runs of 10 (1 of 8 in a later series) before this; with the
/// marker taken before the park's reads but without this look, in 4 of 27; with both, in
/// none of 21 (fault case `lease/a_release_wakes_a_waiter_parking_just_then`).
/// Answers `'released'` with the number of rows released (0 or 1) and the fence released
/// (`LAST_INSERT_ID(fence)`), before the wake-ups, whose failure does not undo it.
///
/// The writes (the lease handed over, the holder's place out, the waiter's place cut) are one
/// transaction, committed before the `'released'` answer: one commit, so one log flush, where
/// three statements committing each on their own flushed the log up to three times on the
/// way from one holder to the next. It locks the lease row first, then places, as an acquire
/// does (whose [`allowed`] reads places after it locked the lease row), so the two cannot
/// deadlock on each other. The server stopping the batch before its `COMMIT` (an error)
/// releases nothing; the caller rolls the connection back (see `release.rs`). A stray wake-up
/// (see [`park_refresh`]) that lands between two statements of the transaction ends the batch
/// without the rest of its answer: the lease row stays locked until the caller gives up on the
/// answer (the statement time-out) and closes the connection, which rolls the transaction back
/// and reports the release failed, the lease still held.
///
/// `bump` (1 for a forced release, else 0) raises the fence counter past the released fence
/// in the same statement, before the hand-off takes the next fence: the waiter's fence is then
/// above the floor the operator is told of.
pub(crate) fn release_batch(
    table: &TableName,
    name: &[u8],
    token: &[u8],
    fence: u64,
    bump: u8,
    mariadb: bool,
) -> String {
    let (t, q) = (table.quoted(), table.queue().quoted());
    let (n, k) = (hex(name), hex(token));
    let current = crate::rows::lease_current(&k, &fence.to_string());
    // Handed over only below the fence maximum (as an acquire would take it). Every
    // assignment reads `fence` before it changes (it is assigned last), so the row's update is
    // the same whichever order the server evaluates assignments in.
    let give = format!(
        "(@lm_next IS NOT NULL AND fence < {})",
        u64::MAX - u64::from(bump)
    );
    format!(
        "SET @lm_next = NULL, @lm_turn = NULL, @lm_late = NULL, @lm_second = NULL, \
         @lm_third = NULL, @lm_id = LAST_INSERT_ID(0); \
         START TRANSACTION; \
         SELECT token, turn_us INTO @lm_next, @lm_turn FROM {q} \
         WHERE name = {n} AND until_at > NOW(6) AND token <> {k} ORDER BY arrived_at, token LIMIT 1; \
         UPDATE {t} SET token = IF({give}, @lm_next, NULL), \
         expires_at = IF({give}, NOW(6) + INTERVAL @lm_turn MICROSECOND, NULL), \
         acquired_at = IF({give}, NOW(6), IF(@lm_next IS NULL AND NOT EXISTS (SELECT 1 FROM {q} w \
         WHERE w.name = {n} AND w.until_at > NOW(6) AND w.token <> {k}), NULL, acquired_at)), \
         fence = LAST_INSERT_ID(fence) + {bump} + IF({give}, 1, 0) \
         WHERE name = {n} AND {current}; \
         SET @lm_done = ROW_COUNT(), @lm_fence = LAST_INSERT_ID(); \
         DELETE FROM {q} WHERE name = {n} AND token = {k}; \
         UPDATE {q} SET until_at = LEAST(until_at, NOW(6) + INTERVAL @lm_turn MICROSECOND) \
         WHERE name = {n} AND token = @lm_next AND @lm_done > 0; \
         COMMIT; \
         SELECT 'released', @lm_done, @lm_fence; \
         SELECT token INTO @lm_late FROM {q} FORCE INDEX (by_arrival) \
         WHERE name = {n} AND until_at > NOW(6) AND @lm_done > 0 AND @lm_next IS NULL \
         ORDER BY arrived_at, token LIMIT 1; \
         SELECT token INTO @lm_second FROM {q} FORCE INDEX (by_arrival) \
         WHERE name = {n} AND until_at > NOW(6) AND @lm_done > 0 \
         ORDER BY arrived_at, token LIMIT 1 OFFSET 1; \
         SELECT token INTO @lm_third FROM {q} FORCE INDEX (by_arrival) \
         WHERE name = {n} AND until_at > NOW(6) AND @lm_done > 0 \
         ORDER BY arrived_at, token LIMIT 1 OFFSET 2; \
         SET @lm_conn = IF(@lm_done > 0, \
         IS_USED_LOCK(CONCAT('{MARKER}', CAST(COALESCE(@lm_next, @lm_late) AS CHAR))), NULL), \
         @lm_long = IF(@lm_done > 0, \
         IS_USED_LOCK(CONCAT('{MARKER}{LONG_MARK}', CAST(COALESCE(@lm_next, @lm_late) AS CHAR))), NULL), \
         @lm_near = IS_USED_LOCK(CONCAT('{MARKER}{LONG_MARK}', CAST(@lm_second AS CHAR))), \
         @lm_nearer = IS_USED_LOCK(CONCAT('{MARKER}{LONG_MARK}', CAST(@lm_third AS CHAR))); \
         {kills}",
        // The waiter handed the lease first: a kill that fails (its session just ended, or
        // another user's) ends the batch, and the others' wake-ups matter less.
        kills = kills(
            &[
                ("@lm_conn", "FALSE"),
                ("@lm_long", "@lm_long = @lm_conn"),
                ("@lm_near", "FALSE"),
                ("@lm_nearer", "@lm_nearer = @lm_near"),
            ],
            mariadb
        ),
    )
}

/// The [`kill`]s of `list` (`(id, skip)`, in order), the last without its `;` (it ends a
/// batch).
fn kills(list: &[(&str, &str)], mariadb: bool) -> String {
    let all: String = list
        .iter()
        .map(|(id, skip)| kill(id, skip, mariadb))
        .collect();
    all.trim_end().trim_end_matches(';').to_owned()
}

/// `KILL QUERY` of the session in the variable `id`, unless it is NULL or `skip` holds,
/// followed by `;` (see [`run_if`]).
fn kill(id: &str, skip: &str, mariadb: bool) -> String {
    let sql = format!("IF({id} IS NULL OR {skip}, 'DO 0', CONCAT('KILL QUERY ', {id}))");
    run_if("lm_kill", &sql, mariadb)
}

/// Runs the statement whose text the SQL expression `sql` yields (`'DO 0'` for none),
/// followed by `;`: one `EXECUTE IMMEDIATE` on MariaDB, a prepared statement named `name`
/// elsewhere (MySQL has no `EXECUTE IMMEDIATE`).
fn run_if(name: &str, sql: &str, mariadb: bool) -> String {
    if mariadb {
        format!("EXECUTE IMMEDIATE {sql}; ")
    } else {
        format!(
            "SET @{name} = {sql}; PREPARE {name} FROM @{name}; EXECUTE {name}; \
             DEALLOCATE PREPARE {name}; "
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_waiter_polls_fast_and_within_its_turn() {
        assert_eq!(first_delay(0), Duration::from_millis(1));
        assert_eq!(first_delay(3), Duration::from_millis(8));
        assert_eq!(first_delay(40), FIRST_POLL_MAX);
        assert!(FIRST_POLL_MAX < HANDOFF);
        // A parked waiter, or one asleep in its back-off, wakes within its turn.
        assert!(turn_for(Duration::from_millis(500)) > PARK_MAX);
        assert!(turn_for(Duration::from_secs(5)) > Duration::from_secs(5));
    }

    #[test]
    fn the_condition_has_four_placeholders() {
        let t = TableName::new("t").unwrap();
        assert_eq!(allowed(&t).matches('?').count(), 4);
    }

    #[test]
    fn the_release_wakes_with_what_the_server_has() {
        // MySQL has no `EXECUTE IMMEDIATE` (a helper's review found the release using it
        // everywhere): there the wake-ups are prepared statements.
        let t = TableName::new("t").unwrap();
        let token = b"0123456789abcdef0123456789abcdef";
        let mysql = release_batch(&t, b"n", token, 7, 0, false);
        assert!(!mysql.contains("EXECUTE IMMEDIATE"), "{mysql}");
        assert_eq!(mysql.matches("PREPARE lm_kill FROM").count(), 4);
        let mariadb = release_batch(&t, b"n", token, 7, 0, true);
        assert_eq!(mariadb.matches("EXECUTE IMMEDIATE").count(), 4);
        assert!(!mariadb.trim_end().ends_with(';'), "{mariadb}");
        // The waiter handed the lease is woken first: a failed kill ends the batch (a
        // helper's review found it last, after kills that can fail).
        for sql in [&mysql, &mariadb] {
            let first = sql
                .split("CONCAT('KILL QUERY ', ")
                .nth(1)
                .and_then(|rest| rest.split(')').next());
            assert_eq!(first, Some("@lm_conn"), "{sql}");
        }
    }

    #[test]
    fn a_place_is_written_only_if_there_is_something_to_wait_for() {
        // Not `INSERT .. SELECT .. ON DUPLICATE KEY UPDATE` (unsafe for statement-based
        // binary logs, a helper's review): a statement run only when `@lm_wait` holds.
        let t = TableName::new("t").unwrap();
        let token = b"0123456789abcdef0123456789abcdef";
        let batch = |mariadb| {
            busy_batch(
                &t,
                b"n",
                token,
                (Duration::from_secs(2), Duration::from_secs(1)),
                Placing::Usual,
                "token",
                mariadb,
            )
        };
        let (mysql, mariadb) = (batch(false), batch(true));
        let insert = "IF(@lm_wait, 'INSERT INTO `t_queue` (name, token, arrived_at, until_at, \
                      turn_us) VALUES (X''6e'', X''3031";
        assert!(
            mariadb.contains(&format!("EXECUTE IMMEDIATE {insert}")),
            "{mariadb}"
        );
        assert!(
            mysql.contains(&format!("SET @lm_place = {insert}")),
            "{mysql}"
        );
        assert!(!mysql.contains("EXECUTE IMMEDIATE"), "{mysql}");
        assert_eq!(mysql.matches("PREPARE lm_place FROM @lm_place").count(), 1);
        for sql in [&mysql, &mariadb] {
            assert!(!sql.contains("FROM DUAL"), "{sql}");
            assert_eq!(sql.matches("INSERT INTO").count(), 1, "{sql}");
        }
    }

    #[test]
    fn the_heads_look_takes_each_servers_syntax() {
        // MariaDB has no `FOR SHARE`; MySQL takes `SKIP LOCKED` only after `FOR SHARE` or
        // `FOR UPDATE`.
        let t = TableName::new("t").unwrap();
        let park = Park {
            length: PARK_MAX,
            again: false,
            long: false,
        };
        let refresh = |mariadb| park_refresh(&t, b"n", b"k", (park, PARK_MAX), mariadb);
        assert!(refresh(true).contains("LOCK IN SHARE MODE SKIP LOCKED;"));
        assert!(!refresh(true).contains("FOR SHARE"));
        assert!(refresh(false).contains("FOR SHARE SKIP LOCKED;"));
        assert!(!refresh(false).contains("LOCK IN SHARE MODE"));
    }

    #[test]
    fn markers_fit_a_user_lock_name() {
        // User lock names are at most 64 characters.
        let token = b"0123456789abcdef0123456789abcdef";
        assert!(marker(token, true).len() <= 64);
        assert!(marker(token, false).len() <= 64);
    }

    #[test]
    fn the_lone_release_has_four_placeholders() {
        // name, token, fence (the lease is current), name (no live place).
        let t = TableName::new("t").unwrap();
        assert_eq!(release_alone(&t).matches('?').count(), 4);
    }
}
