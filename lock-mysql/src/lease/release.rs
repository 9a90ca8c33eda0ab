//! The lease strategy's release: one statement when nobody queues, else a batch that hands
//! the lease to the first waiter and wakes it.

use std::{sync::Arc, time::Instant};

use lock_core::{Lease, LockError};
use sqlx::{AssertSqlSafe, Row};

use super::{LeaseStrategy, changed_current, queue};
use crate::{
    error::Error,
    rows::lease_token_is_ours,
    sql::{broken, retry_deadlocks, settle_or_close, within},
};

impl LeaseStrategy {
    /// Releases `lease` if it is current, handing it to the first waiter, if any, and waking
    /// that waiter (see [`queue::release_batch`]); the server's reply carries the
    /// released fence.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let name = lease.name();
        if !lease_token_is_ours(lease.token()) {
            return Err(LockError::not_held(name));
        }
        let until = self.statement_until();
        // Nobody queues (the usual case): one prepared statement.
        let alone = || {
            retry_deadlocks(|| {
                let query = sqlx::query(AssertSqlSafe(self.sql.release_alone.clone()))
                    .bind(name.as_str().as_bytes())
                    .bind(lease.token().as_str().as_bytes())
                    .bind(lease.fence().get())
                    .bind(name.as_str().as_bytes());
                // Once: run again after its answer was lost, it would find the lease it
                // released gone (fault case `lease/a_lone_release_whose_answer_is_lost_says_so`).
                self.anchor.execute_short_once(until, query)
            })
        };
        // On an error the hand-off batch below decides; if it then finds the lease gone, the
        // statement may have released it before its answer was lost: that error stands.
        // A lease taken after waiting goes straight to the batch (see `waited`).
        let mut first: Option<sqlx::Error> = if self.waited.take(lease.token()) {
            None
        } else {
            match alone().await {
                Ok(done) if changed_current(&done, lease) => return Ok(()),
                Ok(_) => None,
                Err(error) => Some(error),
            }
        };
        let sql: Arc<str> = queue::release_batch(
            &self.table,
            name.as_str().as_bytes(),
            lease.token().as_str().as_bytes(),
            lease.fence().get(),
            0,
            self.limits.mariadb,
        )
        .into();
        let what = format!("releasing `{name}`");
        // Pooled connections closed since their last use (a restart) fail at once and are
        // closed: the release runs again on another (at most once per pooled connection). If
        // a later try finds the lease gone, an earlier one may have released it before its
        // answer was lost: the first error stands (nothing is claimed).
        let mut tries = self.pool.options().get_max_connections();
        let released = loop {
            match retry_deadlocks(|| self.release_once(sql.clone(), until)).await {
                Err(error) if tries > 0 && broken(&error) => {
                    tries -= 1;
                    first.get_or_insert(error);
                }
                Ok(fence) if fence != Some(lease.fence().get()) && first.is_some() => {
                    break Err(first.take().unwrap_or_else(crate::sql::timed_out));
                }
                other => break other,
            }
        }
        .map_err(|e| LockError::from(Error::new(&what, e)))?;
        if released == Some(lease.fence().get()) {
            Ok(())
        } else {
            Err(LockError::not_held(name))
        }
    }

    /// Runs one release batch: the fence it released (`None` when the lease was not current).
    /// An error after the `'released'` answer (the wake-up) is logged, not returned: the
    /// release itself is done.
    pub(super) async fn release_once(
        &self,
        sql: Arc<str>,
        until: Instant,
    ) -> Result<Option<u64>, sqlx::Error> {
        let mut conn = within(until, self.pool.acquire()).await?;
        let mut released: Option<Option<u64>> = None;
        let mut failed = None;
        {
            let mut answers = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(&mut *conn);
            loop {
                match within(until, futures::TryStreamExt::try_next(&mut answers)).await {
                    Ok(Some(sqlx::Either::Right(row)))
                        if row
                            .try_get::<String, _>(0)
                            .is_ok_and(|tag| tag == "released") =>
                    {
                        let done: i64 = row.try_get(1)?;
                        let fence: Option<u64> = row.try_get(2)?;
                        released = Some(fence.filter(|_| done > 0));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(error) => {
                        failed = Some(error);
                        break;
                    }
                }
            }
        }
        match (released, failed) {
            (Some(released), None) => Ok(released),
            (Some(released), Some(error)) => {
                tracing::debug!(%error, "released, but waking the next waiter failed");
                settle_or_close(&mut conn, &error, "DO 0", until).await;
                Ok(released)
            }
            // No answer that it released: the server may have stopped the batch before its
            // `COMMIT` (a lock-wait time-out rolls back only its statement), so the
            // transaction is rolled back before the connection goes back (a connection error,
            // the answer's time limit included, closes it instead).
            (None, Some(error)) => {
                settle_or_close(&mut conn, &error, "ROLLBACK", until).await;
                Err(error)
            }
            (None, None) => {
                conn.close_on_drop();
                Err(sqlx::Error::Protocol(
                    "the release batch gave no answer".into(),
                ))
            }
        }
    }
}
