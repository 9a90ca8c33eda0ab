//! Where a lock lives in Redis: its key, its fence counter, its waiter mark, its release
//! channel and its waiters' queue.
//!
//! All of them share one hash tag, `{<encoded name>}`, so they live in one cluster slot. The
//! encoding escapes `%`, `{` and `}` as `%25`, `%7B`, `%7D`: injective (every valid name maps
//! to one tag and back) and brace-free, so the tag is exactly the encoded name.

use lock_core::LockName;

/// The Redis names of one lock (for operators and tests: what to look at, what to delete).
///
/// ```
/// use lock_core::LockName;
/// use lock_redis::RedisKeys;
///
/// let keys = RedisKeys::new("lock", &LockName::new("jobs/{7}")?);
/// assert_eq!(keys.lock, "lock:{jobs/%7B7%7D}:lock");
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisKeys {
    /// Holds the owner token, with the lease TTL.
    pub lock: String,
    /// The fence counter; it outlives releases so fences never go back.
    pub fence: String,
    /// Present while some client waits for the lock; a release that finds it deletes it and
    /// tells the waiters it names (see [`channel`](Self::channel)).
    pub waiters: String,
    /// The stem of the release channels: a release that found the waiter mark sends a message
    /// to the client of each waiter it names, on `<channel>:<client id>` (on a cluster a shard
    /// channel, on the lock's node: it has the lock's hash tag), and so does an acquire try
    /// that starts the turn of the first waiter in line (naming that waiter alone). Nothing is
    /// published on `<channel>` itself.
    pub channel: String,
    /// The waiters' queue: a sorted set of their owner tokens by arrival (server µs).
    pub queue: String,
    /// Until when each queued waiter keeps its place: a sorted set of the same tokens by
    /// expiry (server ms); a place not renewed in time is dropped.
    pub places: String,
    /// Which client each queued waiter belongs to (a hash from owner token to client id), so
    /// a release knows whose channel to publish on.
    pub clients: String,
}

impl RedisKeys {
    /// The keys of `name` under `prefix`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let tag = encode(name.as_str());
        Self {
            lock: format!("{prefix}:{{{tag}}}:lock"),
            fence: format!("{prefix}:{{{tag}}}:fence"),
            waiters: format!("{prefix}:{{{tag}}}:waiters"),
            channel: format!("{prefix}:{{{tag}}}:released"),
            queue: format!("{prefix}:{{{tag}}}:queue"),
            places: format!("{prefix}:{{{tag}}}:places"),
            clients: format!("{prefix}:{{{tag}}}:clients"),
        }
    }
}

impl RedisKeys {
    /// The hash tag text of a name (or of the start of one: the encoding maps each character
    /// on its own, so the tag of a name's prefix is a prefix of its tag).
    pub(crate) fn tag_of(name: &str) -> String {
        encode(name)
    }
}

/// The name a tag written by [`encode`] stands for; `None` for a tag it never writes.
pub(crate) fn decode(tag: &str) -> Option<String> {
    let mut out = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3)?;
        out.push(match escape {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    // Only the canonical form is ours: `%7B` stands for `{`, and a bare `{` for nothing.
    (encode(&out) == tag).then_some(out)
}

fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(name: &str) -> RedisKeys {
        RedisKeys::new("lock", &LockName::new(name).unwrap())
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let k = keys("a{b}c");
        assert_eq!(k.lock, "lock:{a%7Bb%7Dc}:lock");
        assert_eq!(k.fence, "lock:{a%7Bb%7Dc}:fence");
        assert_eq!(k.waiters, "lock:{a%7Bb%7Dc}:waiters");
        assert_eq!(k.channel, "lock:{a%7Bb%7Dc}:released");
    }

    #[test]
    fn encoding_is_injective_on_tricky_names() {
        let names = ["a%7Bb", "a{b", "%", "%25", "}", "%7D", "a", "A"];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            assert!(seen.insert(keys(n).lock), "collision for {n}");
        }
    }
}
