//! The Lua scripts: each lock operation is one atomic step on the server.

use std::sync::LazyLock;

use redis::Script;

/// Acquire: if the lock key is free, bump the fence counter and `SET key token PX ttl` in the
/// same atomic step. Returns `{1, fence, server_ms}`, `{0, pttl, value}` when held, or
/// `{2, which, what}` when a key holds something this library did not write.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local lt = redis.call('TYPE', KEYS[1]).ok
if lt ~= 'none' and lt ~= 'string' then return {2, 'lock', lt} end
local ft = redis.call('TYPE', KEYS[2]).ok
if ft ~= 'none' and ft ~= 'string' then return {2, 'fence', ft} end
local f = redis.call('GET', KEYS[2])
if f and not string.match(f, '^%d+$') then return {2, 'fence', f} end
local cur = redis.call('GET', KEYS[1])
if cur then return {0, redis.call('PTTL', KEYS[1]), cur} end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
return {1, fence, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
",
    )
});

/// Renew: `PEXPIRE` only if the key holds our token. Returns the server time in ms, or 0.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 0 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
",
    )
});

/// Release: delete only if the key holds our token, and publish the release. Returns 1 or 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 0 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '1')
return 1
",
    )
});

/// Inspect: `{type, value, pttl, fence}` of the lock, read atomically.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local lt = redis.call('TYPE', KEYS[1]).ok
if lt ~= 'string' then return {lt, false, -2, false} end
local ft = redis.call('TYPE', KEYS[2]).ok
local f = false
if ft == 'string' then f = redis.call('GET', KEYS[2]) end
return {lt, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), f}
",
    )
});
