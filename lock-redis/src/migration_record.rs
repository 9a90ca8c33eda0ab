//! [`RedisRecord`]: a migration's record ([`MigrationRecord`]) kept in one Redis server, for
//! fleets of several processes migrating their locks (see `lock_core::migrate`).

use std::sync::LazyLock;

use crate::{RedisBackend, connection::Conn, error::Error, eval::LockScript};
use lock_core::{
    LockError,
    backend::async_trait,
    migrate::{Authority, MigrationRecord, Record},
};

/// Compare-and-set: `KEYS[1]` becomes `ARGV[2]` if it is `ARGV[1]` (an absent key moves
/// nowhere). 1 when it moved.
static ADVANCE: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        r"
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"
        .to_owned(),
    )
});

/// The record as text: `<generation>:<from|to>`.
fn text(record: &Record) -> String {
    let side = match record.authority {
        Authority::From => "from",
        Authority::To => "to",
    };
    format!("{}:{side}", record.generation)
}

fn parse(key: &str, value: &str) -> Result<Record, LockError> {
    let foreign = || {
        LockError::foreign(
            key,
            format!("{value:?} is not a migration record (`<generation>:from` or `:to`)"),
        )
    };
    let (generation, side) = value.split_once(':').ok_or_else(foreign)?;
    Ok(Record {
        generation: generation.parse().map_err(|_| foreign())?,
        authority: match side {
            "from" => Authority::From,
            "to" => Authority::To,
            _ => return Err(foreign()),
        },
    })
}

/// A migration record in the key `<prefix>:{migration}:record` of one Redis server (not a
/// cluster: a failover there could lose the latest write, and the record must never go
/// back). [`MigrationRecord::start`] creates it; a key missing after that is an error (the
/// server lost it: a restart without persistence, an eviction), never a new start.
#[derive(Debug, Clone)]
pub struct RedisRecord {
    conn: Conn,
    key: String,
}

impl RedisBackend {
    /// The migration record kept on this server.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] on a cluster.
    pub fn migration_record(&self) -> Result<RedisRecord, LockError> {
        if self.config().cluster {
            return Err(LockError::invalid_options(
                "a migration record needs one server: on a cluster a failover may lose its \
                 latest write",
            ));
        }
        Ok(RedisRecord {
            conn: self.conn(),
            key: format!("{}:{{migration}}:record", self.config().key_prefix),
        })
    }
}

const NOT_STARTED: Record = Record {
    generation: 0,
    authority: Authority::From,
};

#[async_trait]
impl MigrationRecord for RedisRecord {
    async fn start(&self) -> Result<Record, LockError> {
        let _: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(text(&NOT_STARTED))
            .arg("NX")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| Error::new("start the migration record", e))?;
        self.read().await
    }

    async fn read(&self) -> Result<Record, LockError> {
        let value: Option<String> = redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| Error::new("read the migration record", e))?;
        match value {
            Some(value) => parse(&self.key, &value),
            None => Err(LockError::backend_msg(format!(
                "no migration record at `{}`: `lockctl migrate init` creates it; one that \
                 existed and is gone was lost by the server",
                self.key
            ))),
        }
    }

    async fn advance(&self, current: &Record, next: &Record) -> Result<bool, LockError> {
        if !current.precedes(next) {
            return Err(LockError::invalid_options(format!(
                "a migration record only moves forward: {current:?} cannot become {next:?}"
            )));
        }
        let moved: i64 = ADVANCE
            .key(&self.key)
            .arg(text(current))
            .arg(text(next))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| Error::new("advance the migration record", e))?;
        Ok(moved == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_foreign_text_is_named() {
        for record in [
            NOT_STARTED,
            Record {
                generation: 7,
                authority: Authority::To,
            },
        ] {
            assert_eq!(parse("k", &text(&record)).unwrap(), record);
        }
        for bad in ["", "x:from", "1:sideways", "1"] {
            assert!(
                matches!(parse("k", bad), Err(LockError::Foreign { .. })),
                "{bad}"
            );
        }
    }
}
