//! Sending the library's scripts: by `EVALSHA`, and by `EVAL` when the server does not know
//! the script (a fresh, restarted or flushed server answers `NOSCRIPT`).
//!
//! redis-rs's own fallback (`ScriptInvocation::invoke_async`) sends `SCRIPT LOAD` first, which
//! a cluster connection routes to every node and answers only when all of them have: after an
//! outage (every node restarted, so every script cache empty) one node slow to come back made
//! a release on another node time out (fault case `cluster_release_needs_only_the_locks_node`).
//! `EVAL` goes, like `EVALSHA`, to the node of the call's first key, runs the script once and
//! leaves it cached there; `NOSCRIPT` means the `EVALSHA` ran nothing, so nothing runs twice.

use redis::{Cmd, FromRedisValue, RedisResult, Script, ToRedisArgs, aio::ConnectionLike};

/// One of the library's Lua scripts: its source and its SHA1.
#[derive(Debug)]
pub(crate) struct LockScript {
    source: String,
    script: Script,
}

impl LockScript {
    /// The script of `source`.
    pub(crate) fn new(source: String) -> Self {
        let script = Script::new(&source);
        Self { source, script }
    }

    /// A call of it, with `key` as `KEYS[1]`.
    pub(crate) fn key(&self, key: impl ToRedisArgs) -> Call<'_> {
        self.call().key(key)
    }

    /// A call of it without keys or arguments yet.
    pub(crate) fn call(&self) -> Call<'_> {
        Call {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// A call of a [`LockScript`]: its keys and arguments, ready to send (any number of times).
#[derive(Clone)]
pub(crate) struct Call<'a> {
    script: &'a LockScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The arguments carry owner tokens: only how many there are.
        f.debug_struct("Call")
            .field("script", &self.script.script.get_hash())
            .field("keys", &self.keys.len())
            .field("args", &self.args.len())
            .finish()
    }
}

impl Call<'_> {
    /// Adds `key` to `KEYS`.
    pub(crate) fn key(mut self, key: impl ToRedisArgs) -> Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds `arg` to `ARGV`.
    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The command `verb` (`EVALSHA` or `EVAL`) with `body` (the hash or the source).
    fn command(&self, verb: &str, body: &str) -> Cmd {
        let mut command = redis::cmd(verb);
        command
            .arg(body)
            .arg(self.keys.len())
            .arg(&*self.keys)
            .arg(&*self.args);
        command
    }

    /// The call by its script's hash (`EVALSHA`), as a command to add to a pipeline: a server
    /// that does not know the script answers it with `NOSCRIPT` and runs nothing.
    pub(crate) fn by_hash(&self) -> Cmd {
        self.command("EVALSHA", self.script.script.get_hash())
    }

    /// The call with its script's source (`EVAL`), as a command to add to a pipeline: it runs
    /// on a server that does not know the script, and leaves it cached there, so the
    /// `EVALSHA`s after it in the same pipeline run too.
    pub(crate) fn by_source(&self) -> Cmd {
        self.command("EVAL", &self.script.source)
    }

    /// Runs the call on `conn`: `EVALSHA`, then `EVAL` if the server does not know the script.
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.by_hash().query_async(conn).await {
            Err(error) if unknown_script(&error) => self.by_source().query_async(conn).await,
            other => other,
        }
    }
}

/// Whether `error` is the server's `NOSCRIPT`.
fn unknown_script(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Whether `reply` (one reply of a pipeline that keeps the server's errors as values) is the
/// server's `NOSCRIPT`: that call ran nothing.
pub(crate) fn unknown_script_reply(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(error)
        if error.kind() == Some(redis::ServerErrorKind::NoScript))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_sends_the_hash_then_the_source_with_keys_before_arguments() {
        let script = LockScript::new("return KEYS[1]".to_owned());
        let call = script.key("k").arg(7);
        let packed = |cmd: Cmd| String::from_utf8(cmd.get_packed_command()).unwrap_or_default();
        let by_hash = packed(call.command("EVALSHA", script.script.get_hash()));
        assert!(by_hash.contains(script.script.get_hash()), "{by_hash}");
        assert!(
            by_hash.ends_with("$1\r\n1\r\n$1\r\nk\r\n$1\r\n7\r\n"),
            "{by_hash}"
        );
        let by_source = packed(call.by_source());
        let shown = format!("{:?}", script.key("k").arg("secret-token"));
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(
            by_source.starts_with("*5\r\n$4\r\nEVAL\r\n$14\r\nreturn KEYS[1]\r\n"),
            "{by_source}"
        );
    }
}
