//! The row-lock strategy's operator view: holds listed from `<table>_holds` as the holders
//! wrote them (`READ UNCOMMITTED`; each judged as `inspect` judges it), and a forced release
//! that raises the fence counter, then ends the holder's connection with `KILL CONNECTION`
//! (its transaction rolls back; the waiter InnoDB queued next gets the row, and the holder's
//! parked statement fails, so its `lost()` fires at once).

use std::time::Instant;

use lock_core::{Fence, Forced, HeldLock, LockError, LockName};
use sqlx::Row;

use super::RowLockStrategy;
use crate::{
    error::Error,
    sql::{hex, run_pooled, tagged},
};

/// How often a forced release reads and kills again when the hold changed hands in between.
const TRIES: usize = 5;

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

    /// Raises the fence counter of `name`, then kills the connection of its current hold.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        let n = hex(name.as_str().as_bytes());
        for _ in 0..TRIES {
            let Some(info) = self.inspect(name).await? else {
                return Ok(None);
            };
            let k = hex(info.token.as_str().as_bytes());
            // One batch: the victim's connection read as the holder wrote it, the counter
            // bumped only if it is still there, then the kill.
            let sql = format!(
                "ROLLBACK; SET @lm_victim = NULL, @lm_id = LAST_INSERT_ID(0); \
                 SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION READ ONLY; \
                 SELECT connection_id INTO @lm_victim FROM {h} WHERE name = {n} AND token = {k}; \
                 COMMIT; \
                 UPDATE {f} SET fence = LAST_INSERT_ID(fence + 1) \
                 WHERE name = {n} AND @lm_victim IS NOT NULL; \
                 SELECT 'floor', LAST_INSERT_ID(), @lm_victim; \
                 SET @lm_kill = IF(@lm_victim IS NULL, 'DO 0', CONCAT('KILL CONNECTION ', @lm_victim)); \
                 PREPARE lm_kill FROM @lm_kill; EXECUTE lm_kill; DEALLOCATE PREPARE lm_kill",
                h = self.shared.table.holds().quoted(),
                f = self.shared.table.fences().quoted(),
            );
            let rows = run_pooled(&self.shared.pool, sql, self.until())
                .await
                .map_err(|e| {
                    LockError::from(Error::new(format!("releasing `{name}` by force"), e))
                })?;
            let floor = tagged(&rows, "floor")
                .next()
                .and_then(|row| row.try_get::<u64, _>(1).ok())
                .filter(|floor| *floor > 0);
            if let Some(floor) = floor {
                let evicted = HeldLock::new(name.clone(), &info.token, info.fence, None, None);
                return Ok(Some(Forced::new(evicted, Fence::new(floor))));
            }
        }
        Err(LockError::unavailable_msg(format!(
            "`{name}` changed hands {TRIES} times while it was being released by force; try again"
        )))
    }
}
