//! The row-lock strategy's operator view: holds listed from `<table>_holds` as the holders
//! wrote them (`READ UNCOMMITTED`; each judged as `inspect` judges it), and a forced release
//! that ends the holder's connection with `KILL CONNECTION` (its transaction rolls back; the
//! waiter InnoDB queued next gets the row, and the holder's parked statement fails, so its
//! `lost()` fires at once).

use std::time::Instant;

use lock_core::{Fence, Forced, HeldLock, LockError, LockName};
use sqlx::Row;

use super::RowLockStrategy;
use sqlx::AssertSqlSafe;

use crate::{
    error::{Error, server_code},
    sql::{hex, run, run_pooled, tagged, within},
};

impl RowLockStrategy {
    fn until(&self) -> Instant {
        Instant::now() + self.shared.statement_timeout
    }

    /// The holds whose names start with `prefix`, by name.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        let p = prefix.as_bytes();
        let sql = format!(
            "ROLLBACK; SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; \
             START TRANSACTION READ ONLY; \
             SELECT 'held', name FROM {} WHERE LEFT(name, {}) = {} ORDER BY name; COMMIT",
            self.shared.table.holds().quoted(),
            p.len(),
            hex(p)
        );
        let rows = run_pooled(&self.shared.pool, sql, self.until())
            .await
            .map_err(|e| LockError::from(Error::new("listing the holds", e)))?;
        let mut held = Vec::new();
        for row in tagged(&rows, "held") {
            let bytes: Vec<u8> = row
                .try_get(1)
                .map_err(|e| LockError::from(Error::new("reading a lock name", e)))?;
            let name = LockName::from_bytes(&bytes).map_err(|_| {
                LockError::foreign(
                    String::from_utf8_lossy(&bytes),
                    "a hold record has a name this library never writes",
                )
            })?;
            if let Some(info) = self.inspect(&name).await? {
                // InnoDB's queue is not counted: its waits are not tied to a lock name.
                held.push(HeldLock::new(name, &info.token, info.fence, None, None));
            }
        }
        Ok(held)
    }

    /// Kills the connection of `name`'s current hold. The floor is the evicted fence plus
    /// one: every later grant bumps the counter past it.
    ///
    /// One batch, run once (never repeated on a broken connection: a repeat could kill the
    /// next holder): the victim's connection read as the holder wrote it, read again just
    /// before the kill (a hold released in between is not killed; the server gives the
    /// connection ids of released holds, kept for reuse, to nobody else until they close, so
    /// what is left is the microseconds between the second read and the kill), then the kill.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        let n = hex(name.as_str().as_bytes());
        let h = self.shared.table.holds().quoted();
        let Some(info) = self.inspect(name).await? else {
            return Ok(None);
        };
        let k = hex(info.token.as_str().as_bytes());
        let read = |into: &str| {
            format!(
                "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION READ ONLY; \
                 SELECT connection_id INTO {into} FROM {h} WHERE name = {n} AND token = {k}; COMMIT"
            )
        };
        let sql = format!(
            "ROLLBACK; SET @lm_victim = NULL, @lm_again = NULL; {}; {}; \
             SELECT 'victim', IF(@lm_again <=> @lm_victim, @lm_victim, NULL); \
             SET @lm_kill = IF(@lm_victim IS NOT NULL AND @lm_again <=> @lm_victim, \
             CONCAT('KILL CONNECTION ', @lm_victim), 'DO 0'); \
             PREPARE lm_kill FROM @lm_kill; EXECUTE lm_kill; DEALLOCATE PREPARE lm_kill",
            read("@lm_victim"),
            read("@lm_again"),
        );
        let what = || format!("releasing `{name}` by force");
        let until = self.until();
        let mut conn = within(until, self.shared.pool.acquire())
            .await
            .map_err(|e| LockError::from(Error::new(what(), e)))?;
        let rows = match within(until, run(&mut conn, AssertSqlSafe(sql))).await {
            Ok(rows) => rows,
            // 1094: the connection had ended by itself; so had the hold.
            Err(error) if server_code(&error) == Some(1094) => return Ok(None),
            Err(error) => {
                conn.close_on_drop();
                return Err(LockError::from(Error::new(what(), error)));
            }
        };
        let killed = tagged(&rows, "victim")
            .next()
            .and_then(|row| row.try_get::<Option<u64>, _>(1).ok().flatten())
            .is_some();
        if !killed {
            // Released (or given up) between the look and the kill: nothing was forced.
            return Ok(None);
        }
        let evicted = HeldLock::new(name.clone(), &info.token, info.fence, None, None);
        let floor = info.fence.get().saturating_add(1);
        Ok(Some(Forced::new(evicted, Fence::new(floor))))
    }
}
