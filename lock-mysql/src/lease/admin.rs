//! The lease strategy's operator view: held leases listed from the table (each judged as
//! `inspect` judges it), and a forced release that is the release batch run with the
//! holder's token and a fence bump, so the first waiter gets the lease (above the floor) and
//! is woken as after any release.

use std::sync::Arc;

use lock_core::{Fence, Forced, HeldLock, LockError, LockInfo, LockName};
use sqlx::Row;

use super::{LeaseStrategy, queue};
use crate::{
    error::Error,
    sql::{hex, retry_deadlocks, run_pooled},
};

/// How often a forced release reads and releases again when the lease changed hands in
/// between.
const TRIES: usize = 5;

impl LeaseStrategy {
    /// The held leases whose names start with `prefix`, by name.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        let p = prefix.as_bytes();
        let sql = format!(
            "SELECT 'held', name FROM {} WHERE token IS NOT NULL AND expires_at > NOW(6) \
             AND LEFT(name, {}) = {} ORDER BY name",
            self.table.quoted(),
            p.len(),
            hex(p)
        );
        let rows = run_pooled(&self.pool, sql, self.statement_until())
            .await
            .map_err(|e| LockError::from(Error::new("listing the held leases", e)))?;
        let mut held = Vec::new();
        for row in &rows {
            let bytes: Vec<u8> = row
                .try_get(1)
                .map_err(|e| LockError::from(Error::new("reading a lock name", e)))?;
            let Ok(name) = LockName::from_bytes(&bytes) else {
                return Err(LockError::foreign(
                    String::from_utf8_lossy(&bytes),
                    format!(
                        "a row of {} has a name this library never writes",
                        self.table
                    ),
                ));
            };
            if let Some(info) = self.inspect(&name).await? {
                held.push(self.held(&info).await?);
            }
        }
        Ok(held)
    }

    /// `info` as an operator sees it, with the waiters that keep a live place.
    async fn held(&self, info: &LockInfo) -> Result<HeldLock, LockError> {
        let sql = format!(
            "SELECT 'waiters', COUNT(*) FROM {} WHERE name = {} AND until_at > NOW(6)",
            self.table.queue().quoted(),
            hex(info.name.as_str().as_bytes())
        );
        let rows = run_pooled(&self.pool, sql, self.statement_until())
            .await
            .map_err(|e| LockError::from(Error::new("counting the waiters", e)))?;
        let waiters = rows
            .first()
            .and_then(|row| row.try_get::<i64, _>(1).ok())
            .and_then(|n| u64::try_from(n).ok());
        Ok(HeldLock::new(
            info.name.clone(),
            &info.token,
            info.fence,
            info.expires_in,
            waiters,
        ))
    }

    /// Releases `name`'s lease with its holder's token, bumping the fence (see
    /// [`queue::release_batch`]).
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        for _ in 0..TRIES {
            let Some(info) = self.inspect(name).await? else {
                return Ok(None);
            };
            let evicted = self.held(&info).await?;
            let sql: Arc<str> = queue::release_batch(
                &self.table,
                name.as_str().as_bytes(),
                info.token.as_str().as_bytes(),
                info.fence.get(),
                1,
                self.limits.mariadb,
            )
            .into();
            let until = self.statement_until();
            let released = retry_deadlocks(|| self.release_once(sql.clone(), until))
                .await
                .map_err(|e| {
                    LockError::from(Error::new(format!("releasing `{name}` by force"), e))
                })?;
            if released == Some(info.fence.get()) {
                return Ok(Some(Forced::new(evicted, Fence::new(info.fence.get() + 1))));
            }
        }
        Err(LockError::unavailable_msg(format!(
            "`{name}` changed hands {TRIES} times while it was being released by force; try again"
        )))
    }
}
