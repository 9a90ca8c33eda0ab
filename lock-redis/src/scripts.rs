//! The Lua scripts: each lock operation is one atomic step on the server.

use std::sync::LazyLock;

use crate::eval::LockScript;

/// How far ahead of the server's clock a fence floor proposed by the caller may be (ms); one
/// further ahead is ignored (see [`ACQUIRE`]).
pub(crate) const FLOOR_LEAD_MS: u64 = 5_000;

/// The largest fence a counter may reach: 2^53, so that every fence is exact in a double
/// (Lua's numbers, JSON readers) and the script's arithmetic never rounds. The server clock in
/// microseconds reaches it in the year 2255.
pub(crate) const MAX_FENCE: u64 = 1 << 53;

/// Acquire, in one atomic step. Returns `{1, fence, server_ms}` when granted (the fence as a
/// decimal string); `{0, pttl, value, rank, seen}` when held; `{3, turn, rank, seen}` when
/// free but the turn of the first waiter in the queue; `{4, fence}` when the lock holds
/// the caller's own token already and `ARGV[11]` is `1` (a release handed it over, see
/// [`hand_on`]; Redlock passes `2`, and its own token counts as busy); `{2, which, what}`
/// when a key holds something this library did not write, with nothing written. `rank` is the
/// caller's place in the queue (0 first, -1 not queued); `seen` the larger of the fence
/// counter as the try found it (0 when absent or not a number) and the server time in µs: a
/// hand-over issues a fence above both at its own time, so a hand-over message whose fence is
/// above `seen` was issued after this try ran, even when the counter was lost in between (an
/// eviction: a counter alone would then let an old message pass for a new one).
///
/// A waiter queues (`KEYS[4]`, ordered by ticket) when `ARGV[5]` (how long its place lasts
/// without another try, in ms) is above zero. Its ticket is `ARGV[7]`, or the server time in µs
/// when that is 0: Redlock passes one ticket, fixed for the whole wait, to every server, so
/// that every server orders the same waiters alike and a waiter that rejoins (after its place
/// was taken by a grant it had to give back, or lost with a restart) gets its place back.
/// `ARGV[6]` is how long the first waiter's turn lasts once the lock is free. `ARGV[8]` names
/// the waiter's client (`0`: none, it is not woken by push): a queued waiter's client is kept
/// in the hash `KEYS[6]`, with the TTL it asks for when `ARGV[11]` is `1` (`"<client> <ttl
/// ms>"`), so that a release publishes only to the clients it names and can hand the lock over
/// to a waiter that recorded its TTL (see [`RELEASE`]). The
/// three keys of the queue expire at the latest end any place was given (each place written
/// pushes their expiry to its own end, never back; the queue and the places always together, so
/// one `PTTL` decides for both), so the places of waiters that died go even when nobody tries
/// the lock again to sweep them.
///
/// When the lock is free, the fence counter is checked *before* anything is written: it must
/// be absent or a decimal `0 <= n < 2^53` with no sign or leading zeros (anything else, of any
/// type, is reported). The new fence is `max(counter + 1, server time in µs)`, written back
/// to the counter: a hybrid clock. It is above every fence issued before even when the counter
/// was lost (a restart without persistence, an eviction), as long as the server's clock does
/// not step back. A fence that would reach 2^53 is not issued: the counter is reported as at
/// its maximum (`{2, 'fence', counter}`), nothing written. Every number stays below 2^53, so
/// Lua's doubles hold them exactly.
///
/// `ARGV[12]` is a floor the caller proposes for the fence (0: none; Redlock sends its client's
/// clock in µs plus a second, so that the servers of a majority usually issue one fence and
/// need no write-back round): the fence is raised to it when it is above both, unless it is
/// more than [`FLOOR_LEAD_MS`] ms ahead of the server's clock (a client clock far ahead
/// would push the counters, and every later fence, as far), when it is ignored. A counter
/// raised by a floor leads the server's clock by up to that much, so on a server that then
/// loses its counter within that lead, the next fence can be lower than that floor.
///
/// `redis.replicate_commands()` makes servers before 5.0 replicate the writes (the fence
/// computed here) rather than the script, which is non-deterministic; later servers always do.
///
/// `ARGV[3]` is the caller's [`Mark`] (as a number): a subscribed waiter's busy answer also sets
/// the waiter mark (`KEYS[3]`) until the hold's expiry plus `ARGV[4]` ms, so that the release
/// publishes. In the same atomic step as the busy answer, so no release falls between the
/// check and the mark. A waiter retries at the expiry it was told, and renews the mark then if
/// the holder renewed. A grant also marks when the caller's siblings (other waiters of the
/// same client, which one release message does not all wake) still wait. A mark is only ever
/// lengthened.
///
/// A try that finds the lock free during no turn while someone else is first in the queue
/// starts that waiter's turn (cuts its place to the turn's end) and, when `ARGV[9]` (the stem
/// of the release channels) is not empty, tells that waiter's client as a release would,
/// naming it alone, with the command `ARGV[10]` (see [`RELEASE`]): a waiter that became first
/// without a release naming it (those ahead gave up, died, or missed their turns) learns that
/// its turn runs, rather than at its next try, when the turn may be over. On Redlock each
/// server tells it (these messages make a Redlock waiter vote, as releases' messages do).
/// With `ARGV[11]` `2` (Redlock), every try that finds the lock free while waiters queue first
/// takes out of the line the waiters at its head whose recorded client no longer listens there
/// ([`drop_deaf_heads`]), so a waiter that died gets no turn.
///
/// A free lock with no queue (the uncontended case) takes a short path: `GET`, `EXISTS`,
/// `TIME`, the counter, two `SET`s, without sweeping the places of waiters that left. With
/// 100,000 tries on new names (`redis-benchmark -P 16`), it cut the server's time per call
/// from 33.5 µs to 19.3 µs on this project's 2-core machines; a script that only does
/// `SET NX PX` costs 7.6 µs there, a script call's base cost.
pub(crate) static ACQUIRE: LazyLock<LockScript> = LazyLock::new(|| {
    let counter = read_counter("KEYS[2]");
    let drop_deaf = drop_deaf_heads(
        "KEYS[4]", "KEYS[5]", "KEYS[6]", "ARGV[9]", "ARGV[10]", "ARGV[1]",
    );
    LockScript::new(format!(
        r"
redis.replicate_commands()
local function mark(ms)
  if redis.call('PTTL', KEYS[3]) < ms then redis.call('SET', KEYS[3], '1', 'PX', ms) end
end
local function grant(t, now, first)
{counter}
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local floor = tonumber(ARGV[12]) or 0
  if not (floor <= us + {FLOOR_LEAD_MS} * 1000) then floor = 0 end
  local issued = math.max(last + 1, us, floor)
  if issued >= {MAX_FENCE} then return {{2, 'fence', string.format('%.0f', last)}} end
  local fence = string.format('%.0f', issued)
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('SET', KEYS[2], fence)
  if first then
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('ZREM', KEYS[5], ARGV[1])
    redis.call('HDEL', KEYS[6], ARGV[1])
  end
  if ARGV[3] == '2' or (first and redis.call('EXISTS', KEYS[4]) == 1) then mark(tonumber(ARGV[2]) + tonumber(ARGV[4])) end
  return {{1, fence, now}}
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {{2, 'lock', redis.call('TYPE', KEYS[1]).ok}} end
if cur == ARGV[1] and ARGV[11] == '1' then
  return {{4, redis.pcall('GET', KEYS[2])}}
end
if not cur and redis.call('EXISTS', KEYS[4]) == 0 then
  local t = redis.call('TIME')
  return grant(t, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), nil)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  redis.call('HDEL', KEYS[6], id)
end
local place = tonumber(ARGV[5])
local ticket = tonumber(ARGV[7])
if ticket == 0 then ticket = tonumber(t[1]) * 1000000 + tonumber(t[2]) end
local function join()
  if place > 0 then
    redis.call('ZADD', KEYS[4], 'NX', ticket, ARGV[1])
    redis.call('ZADD', KEYS[5], now + place, ARGV[1])
    if redis.call('PTTL', KEYS[5]) < place then
      redis.call('PEXPIRE', KEYS[4], place)
      redis.call('PEXPIRE', KEYS[5], place)
    end
    if ARGV[8] ~= '0' then
      local entry = ARGV[8]
      if ARGV[11] == '1' then entry = entry .. ' ' .. ARGV[2] end
      redis.call('HSET', KEYS[6], ARGV[1], entry)
      if redis.call('PTTL', KEYS[6]) < place then redis.call('PEXPIRE', KEYS[6], place) end
    end
  end
end
local function rank()
  return redis.call('ZRANK', KEYS[4], ARGV[1]) or -1
end
local function seen()
  local f = tonumber(redis.pcall('GET', KEYS[2])) or 0
  return string.format('%.0f', math.max(f, tonumber(t[1]) * 1000000 + tonumber(t[2])))
end
if cur then
  local pttl = redis.call('PTTL', KEYS[1])
  join()
  if ARGV[3] ~= '0' and pttl > 0 then mark(pttl + tonumber(ARGV[4])) end
  return {{0, pttl, cur, rank(), seen()}}
end
if ARGV[11] == '2' then
{drop_deaf}
end
local first = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
local kept = first and redis.call('ZSCORE', KEYS[5], first)
if first and not kept then
  redis.call('ZREM', KEYS[4], first)
  redis.call('HDEL', KEYS[6], first)
  join()
  return {{3, 0, rank(), seen()}}
end
if first and first ~= ARGV[1] then
  local turn_end = math.min(tonumber(kept), now + tonumber(ARGV[6]))
  if tonumber(kept) > turn_end then
    redis.call('ZADD', KEYS[5], 'XX', turn_end, first)
    if ARGV[9] ~= '' then
      local client = redis.call('HGET', KEYS[6], first)
      if client then redis.pcall(ARGV[10], ARGV[9] .. ':' .. string.match(client, '^%S*'), first) end
    end
  end
  join()
  if ARGV[3] ~= '0' then mark(turn_end - now + tonumber(ARGV[4])) end
  return {{3, turn_end - now, rank(), seen()}}
end
return grant(t, now, first)
"
    ))
});

/// Keep a place: what a Redlock waiter deep in line sends instead of a vote while it only
/// keeps its place (`KEYS[1]` the lock, `KEYS[2]` the queue, `KEYS[3]` the places, `KEYS[4]`
/// the waiters' clients; `ARGV[1]` its token, `ARGV[2]` how long its place lasts from now, in
/// ms, `ARGV[3]` the longest turn, in ms). Returns `{rank, turn}`: the waiter's place in line
/// (0 first), and how long the turn it found running lasts (ms; -1: none). The rank is -1
/// when it should vote at once instead:
/// - the lock is free and no turn runs (the first waiter's place ends later than a turn
///   would, or has ended): a vote starts the first one's turn, or takes the lock;
/// - the lock is free and the caller is first;
/// - the waiter has no place here (it lapsed, or was taken out of the line), which a vote
///   gives back under its ticket.
///
/// A lock free during a turn is left to the waiter whose turn it is (a release or a vote named it):
/// a call then would mostly find it taken a moment later; the caller calls again when that turn is
/// over, and that call asks for a vote if the lock is still free with no turn running (a first
/// waiter's own place that is about to run out looks the same, and is over as soon). Else the call
/// writes only the place's end (and pushes the queue's expiry, as [`ACQUIRE`] does): no sweep of
/// lapsed places, no waiter mark, no client record, which the votes of the waiters nearer the head
/// see to.
pub(crate) static KEEP: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        r"
redis.replicate_commands()
local place = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local turn = -1
if redis.call('EXISTS', KEYS[1]) == 0 then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not first or first == ARGV[1] then return {-1, -1} end
  local ends = tonumber(redis.call('ZSCORE', KEYS[3], first))
  if not ends or ends <= now or ends > now + tonumber(ARGV[3]) then return {-1, -1} end
  turn = ends - now
end
if redis.call('ZADD', KEYS[3], 'XX', 'CH', now + place, ARGV[1]) == 0 then return {-1, -1} end
if redis.call('PTTL', KEYS[3]) < place then
  redis.call('PEXPIRE', KEYS[2], place)
  redis.call('PEXPIRE', KEYS[3], place)
end
if redis.call('PTTL', KEYS[4]) < place then redis.call('PEXPIRE', KEYS[4], place) end
return {redis.call('ZRANK', KEYS[2], ARGV[1]) or -1, turn}
"
        .to_owned(),
    )
});

/// Leave: a waiter that gives up takes its place out of the queue (`KEYS[1]` the queue,
/// `KEYS[2]` the places, `KEYS[3]` the waiters' clients, `ARGV[1]` its token). Returns how
/// many places it removed.
///
/// With `ARGV[5]` = `1` (a single server or a cluster, which hand the lock over, see
/// [`RELEASE`]), a release may have handed the lock (`KEYS[4]`) to this waiter just as it gave
/// up: then it releases the lock as [`RELEASE`] does, handing it on to the next waiter (the
/// waiter mark `KEYS[5]`, the fence counter `KEYS[6]`, and `ARGV[2..6]` as there). Without
/// it, a waiter that left (its acquire timed out, or its future was dropped) as the lock was
/// handed to it would keep the lock from everyone for its TTL (fault case
/// `a_lock_handed_to_a_waiter_that_leaves_goes_to_the_next`).
pub(crate) static LEAVE: LazyLock<LockScript> = LazyLock::new(|| {
    let hand_on = hand_on(
        "KEYS[4]", "KEYS[5]", "KEYS[1]", "KEYS[2]", "KEYS[3]", "KEYS[6]",
    );
    LockScript::new(format!(
        r"
redis.replicate_commands()
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[5] == '1' and redis.pcall('GET', KEYS[4]) == ARGV[1] then
  redis.call('DEL', KEYS[4])
  local mark_left = redis.call('PTTL', KEYS[5])
  if redis.call('DEL', KEYS[5]) == 1 then
{hand_on}
  end
end
return removed
"
    ))
});

/// How long the first waiter in the queue has to come for a lock that became free before it
/// loses its place (a waiter that died or is paused stalls the lock for at most this long,
/// when it gets a turn: when its client's connection is closed or it polls; a single server or
/// a cluster hands the lock over to a waiter whose client listens, see [`RELEASE`]; on Redlock
/// a waiter whose recorded client no longer listens on the server is taken out of the line
/// there before its turn, see [`drop_deaf_heads`]). Redlock's release starts a turn this long;
/// a turn its vote starts lasts 400 ms.
pub(crate) const HANDOFF_MS: u64 = 100;

/// Lua that reads the fence counter `key` into `last` (0 when absent), or returns
/// `{2, 'fence', what}` when it holds anything but a counter this library can raise (see
/// [`ACQUIRE`]). The length check comes first, so `tonumber` only sees at most 16 digits.
fn read_counter(key: &str) -> String {
    counter_or(
        key,
        &format!("return {{2, 'fence', redis.call('TYPE', {key}).ok}}"),
        "return {2, 'fence', last}",
    )
}

/// Lua that reads the fence counter `key` into `last` as [`read_counter`] does, running
/// `on_type` when the key is not a string and `on_value` when it is not a counter.
fn counter_or(key: &str, on_type: &str, on_value: &str) -> String {
    format!(
        r"
local last = redis.pcall('GET', {key})
if type(last) == 'table' then
  {on_type}
elseif not last then
  last = 0
elseif #last <= 16 and (last == '0' or string.match(last, '^[1-9]%d*$')) and tonumber(last) < {MAX_FENCE} then
  last = tonumber(last)
else
  {on_value}
end
"
    )
}

/// Raise (Redlock): sets the fence counter `KEYS[1]` to `ARGV[1]` unless it is already at
/// least that. Returns `{1}`, or `{2, 'fence', what}` for a counter this library did not
/// write (as [`ACQUIRE`]), with nothing written. A counter only ever grows.
pub(crate) static RAISE: LazyLock<LockScript> = LazyLock::new(|| {
    let counter = read_counter("KEYS[1]");
    LockScript::new(format!(
        r"
{counter}
if last < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return {{1}}
"
    ))
});

/// Renew (one lease, or a batch on one server): for each `KEYS[i]`, `PEXPIRE` to `ARGV[2i]`
/// ms only if it holds the token `ARGV[2i-1]`. Returns one number per key: the server time in
/// ms (read once, before the first renewal, so never later than the renewal), or 0 when not
/// ours. The keys of one call must share a slot on a cluster, so a cluster renews one lease
/// per call.
pub(crate) static RENEW_MANY: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  if redis.pcall('GET', key) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = now
  else
    out[i] = 0
  end
end
return out
"
        .to_owned(),
    )
});

/// How many leases one call of [`RENEW_MANY`] renews at most.
pub(crate) const RENEW_MANY_CHUNK: usize = 500;

/// Whether an acquisition try sets the waiter mark (see [`ACQUIRE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// Not waiting (a first try, or no confirmed subscription): never.
    No = 0,
    /// A subscribed waiter: when the lock is busy.
    WhenBusy = 1,
    /// A subscribed waiter whose siblings wait too: when busy, and on a grant.
    Always = 2,
}

/// How long a waiter mark outlives the hold it was set against: time for a waiter woken by
/// the hold's expiry to try again and renew the mark if the holder renewed instead.
pub(crate) const MARK_MARGIN_MS: u64 = 1_000;

/// Release: delete only if the key holds our token; if the waiter mark (`KEYS[2]`) is there,
/// delete it too and see to the waiters in line ([`hand_on`]). Returns 1 or 0. Without waiters
/// nothing is published.
///
/// Keys: `KEYS[1]` the lock, `KEYS[2]` the mark, `KEYS[3]` the queue, `KEYS[4]` the places,
/// `KEYS[5]` the waiters' clients, `KEYS[6]` the fence counter. Arguments: `ARGV[1]` the
/// token, `ARGV[2]` the stem of the release channels, `ARGV[3]` the first waiter's turn (ms),
/// `ARGV[4]` the command that publishes, `ARGV[5]` `1` to hand the lock over (a single server
/// or a cluster), `0` not to, `2` not to and to take out of the line first the waiters at its
/// head whose client no longer listens here (Redlock: one server cannot grant a majority; see
/// [`drop_deaf_heads`]), `ARGV[6]` how long a mark outlives a hold ([`MARK_MARGIN_MS`]).
///
/// On a cluster a plain `PUBLISH` crosses the cluster bus to every node: two of them per
/// release stalled hand-offs there (16 separate clients holding 1 ms: 95 acquisitions/s and a
/// hand-off p99 of 44 ms, against 333/s with one). One message on the lock's channel, which
/// every waiting client heard, did not stall 16 clients but woke every waiting client at each
/// release: 100 clients did 184 and 177 acquisitions/s in two runs, 1,000 did 31 and 32/s
/// (fault case `a_cluster_release_tells_only_the_clients_it_names`).
pub(crate) static RELEASE: LazyLock<LockScript> = LazyLock::new(|| {
    let hand_on = hand_on(
        "KEYS[1]", "KEYS[2]", "KEYS[3]", "KEYS[4]", "KEYS[5]", "KEYS[6]",
    );
    LockScript::new(format!(
        r"
redis.replicate_commands()
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local mark_left = redis.call('PTTL', KEYS[2])
if redis.call('DEL', KEYS[2]) == 1 then
{hand_on}
end
return 1
"
    ))
});

/// Lua that sees to the waiters in line once a lock is free and its waiter mark deleted (in
/// [`RELEASE`], and in [`LEAVE`] of a waiter the lock was handed to): the keys are named by the
/// arguments, `ARGV[2..6]` are [`RELEASE`]'s, and `mark_left` is what the mark had left (its
/// `PTTL` before the delete).
///
/// **Hand-over** (`ARGV[5]` = `1`): the lock goes to the first waiter in the queue in this same
/// step, when its place is live and its client is recorded with its TTL (a busy try of a client
/// that takes hand-overs records `"<client> <ttl ms>"`, see [`ACQUIRE`]): the lock key takes that
/// waiter's token for its TTL, with a fence `max(counter + 1, server time in µs)` as a grant's, and
/// the message `"=<token> <fence> <server ms>"` goes to its client's channel. The waiter's place
/// goes, and the mark is set again when others still queue, for as long as it had left or the new
/// holder's TTL and a margin, whichever is longer (the waiters behind, who are not told, sleep
/// until the expiry they were last told, which the old mark covered: they must find it when they
/// come to renew it). So the waiter holds the lock when its message arrives: no try of its own, one
/// round trip less per hand-off. Only when the waiter's client is subscribed to its channel
/// (`PUBSUB NUMSUB`, on a cluster `PUBSUB SHARDNUMSUB`; pattern subscribers do not count) and the
/// message goes out: a waiter whose client is gone (its connection closed) or not subscribed (it
/// polls) would otherwise hold the lock until its TTL. Else (and when the publish is refused, when
/// the hand-over is undone: the lock key deleted, the counter not written) the turn below applies.
/// A waiter whose connection the server still counts as open (its process paused, or its host
/// crashed or cut off until TCP keepalive gives up) does get the lock, and holds it, like a holder
/// in that state, until its TTL unless it comes back: the same as a ZooKeeper or etcd queue, where
/// a waiter whose session lives becomes the holder when its turn comes.
///
/// **Turn** (no hand-over): the message names the first two queued waiters: `"<first>
/// <second>"`, and goes only to their clients, each on its own channel `ARGV[2]:<client>`, with
/// the command `ARGV[4]`: `PUBLISH`, or on a cluster `SPUBLISH` (a shard channel, which stays
/// on the lock's node; the channel has the lock's hash tag). So a release costs the same with
/// ten or a thousand waiting clients. Only the client of the first wakes a waiter (the one
/// whose turn it is), and the first's turn starts now: it keeps its place for at most `ARGV[3]`
/// ms more. The client of the second retries when that turn ends, unless another release
/// reaches it first, so a first waiter that does not come (its client gone, or on Redlock
/// paused, or its host gone without a reset until TCP keepalive closes its connection) stalls
/// the lock for one turn; on Redlock a waiter whose recorded client no longer listens on this
/// server is taken out of the line first ([`drop_deaf_heads`]). A waiter queued with no client
/// (`0`) gets no message, and one whose client is not subscribed (it polls) hears none.
///
/// A message the server refuses (an ACL without the channel, a cluster older than Redis 7.0
/// that has no `SPUBLISH`) is skipped, and counts as heard by nobody: the key is deleted by
/// then, and a script's writes stay when it fails, so an error would report a failed release
/// of a lock that is free (fault case `a_release_whose_message_is_refused_still_releases`).
/// The waiters it would have woken retry at the expiry they were told.
fn hand_on(
    lock: &str,
    mark: &str,
    queue: &str,
    places: &str,
    clients: &str,
    fence: &str,
) -> String {
    // A counter this library did not write is not raised: no hand-over (the next grant by a
    // try reports it).
    let counter = counter_or(fence, "last = nil", "last = nil");
    let drop_deaf = drop_deaf_heads(queue, places, clients, "ARGV[2]", "ARGV[4]", "false");
    format!(
        r"
  if ARGV[5] == '2' then
{drop_deaf}
  end
  local next = redis.call('ZRANGE', {queue}, 0, 1)
  if next[1] then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local kept = redis.call('ZSCORE', {places}, next[1])
    local entry = redis.call('HGET', {clients}, next[1])
    local handed = false
    local client, ttl
    if entry then client, ttl = string.match(entry, '^(%S+) (%d+)$') end
    local channel = client and ARGV[2] .. ':' .. client
    local listening = false
    if ARGV[5] == '1' and client and tonumber(ttl) > 0 and kept and tonumber(kept) > now then
      local subs = redis.pcall('PUBSUB', ARGV[4] == 'SPUBLISH' and 'SHARDNUMSUB' or 'NUMSUB', channel)
      listening = type(subs) == 'table' and tonumber(subs[2]) ~= nil and tonumber(subs[2]) > 0
    end
    if listening then
{counter}
      if last then
        local issued = string.format('%.0f', math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
        local set = redis.pcall('SET', {lock}, next[1], 'PX', ttl)
        local heard = 0
        if type(set) == 'table' and set.ok then
          heard = redis.pcall(ARGV[4], channel, '=' .. next[1] .. ' ' .. issued .. ' ' .. now)
        end
        if type(heard) == 'number' and heard > 0 then
          redis.call('SET', {fence}, issued)
          redis.call('ZREM', {queue}, next[1])
          redis.call('ZREM', {places}, next[1])
          redis.call('HDEL', {clients}, next[1])
          if redis.call('EXISTS', {queue}) == 1 then
            redis.call('SET', {mark}, '1', 'PX', math.max(mark_left, tonumber(ttl) + tonumber(ARGV[6])))
          end
          handed = true
        else
          redis.call('DEL', {lock})
        end
      end
    end
    if not handed then
      local turn_end = now + tonumber(ARGV[3])
      if kept and tonumber(kept) > turn_end then redis.call('ZADD', {places}, 'XX', turn_end, next[1]) end
      local message = table.concat(next, ' ')
      local told = {{}}
      for _, token in ipairs(next) do
        local client = redis.call('HGET', {clients}, token)
        if client then client = string.match(client, '^%S*') end
        if client and not told[client] then
          told[client] = true
          redis.pcall(ARGV[4], ARGV[2] .. ':' .. client, message)
        end
      end
    end
  end
"
    )
}

/// How many waiters one call of [`drop_deaf_heads`]' Lua takes out of the line at most.
const DEAF_HEADS: usize = 8;

/// Lua that takes out of the line (`queue`, `places`, `clients`) the waiters at its head whose
/// client is recorded (they took push wake-ups) but has no subscriber here on its channel
/// `<stem>:<client>` (`PUBSUB NUMSUB`, or `SHARDNUMSUB` when `command` is `SPUBLISH`): their
/// process died, or their pub/sub connection to this server closed, so a release here cannot
/// reach them, and a turn given to them would most likely only hold the lock back. Redlock
/// records a waiter's client only on the servers where its subscription is confirmed (see
/// `RedlockBackend::vote`). It stops at the first waiter that may come (a paused process's
/// connection stays subscribed, as does a crashed host's until TCP keepalive closes it: it
/// keeps its place and gets its turn), at
/// `me` (the caller's own token), when `stem` is empty, when the server refuses the count, and
/// after [`DEAF_HEADS`] waiters. Redlock runs it ([`crate::ops::Next::TurnIfListening`]): a
/// waiter keeps its ticket for its whole wait, so one taken out of a server's line whose
/// connection there only dropped gets its place back with its next vote. `stem`, `command`
/// and `me` are Lua expressions.
fn drop_deaf_heads(
    queue: &str,
    places: &str,
    clients: &str,
    stem: &str,
    command: &str,
    me: &str,
) -> String {
    format!(
        r"
  for _ = 1, {DEAF_HEADS} do
    if {stem} == '' then break end
    local head = redis.call('ZRANGE', {queue}, 0, 0)[1]
    if not head or head == {me} then break end
    local entry = redis.call('HGET', {clients}, head)
    local client = entry and string.match(entry, '^(%S+)')
    if not client or client == '0' then break end
    local subs = redis.pcall('PUBSUB', {command} == 'SPUBLISH' and 'SHARDNUMSUB' or 'NUMSUB', {stem} .. ':' .. client)
    if type(subs) ~= 'table' or tonumber(subs[2]) ~= 0 then break end
    redis.call('ZREM', {queue}, head)
    redis.call('ZREM', {places}, head)
    redis.call('HDEL', {clients}, head)
  end
"
    )
}

/// Inspect: `{type, value, pttl, fence}` of the lock, read atomically.
pub(crate) static INSPECT: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        r"
local lt = redis.call('TYPE', KEYS[1]).ok
if lt ~= 'string' then return {lt, false, -2, false} end
local ft = redis.call('TYPE', KEYS[2]).ok
local f = false
if ft == 'string' then f = redis.call('GET', KEYS[2]) end
return {lt, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), f}
"
        .to_owned(),
    )
});
