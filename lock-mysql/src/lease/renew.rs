//! The lease strategy's renewals: one prepared statement for one lease, one transaction for
//! a batch.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use lock_core::{
    Lease, LockError,
    backend::{Grant, validate_ttl},
};
use sqlx::{AssertSqlSafe, Row};

use super::{LeaseStrategy, RENEW_BATCH, changed_current, micros};
use crate::{
    error::Error,
    rows::{lease_current, lease_token_is_ours},
    sql::{execute_within, hex, retry_broken, retry_deadlocks, run_pooled, tagged},
};

impl LeaseStrategy {
    /// Renews one lease (see `renew_one`).
    pub(crate) async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        validate_ttl(ttl)?;
        self.renew_one(lease, ttl).await
    }

    /// Extends `lease` to `ttl` from now if it is current: one prepared statement, whose reply
    /// carries the fence of the row it changed (`LAST_INSERT_ID(fence)`), as release's does.
    /// A lease that is not current (expired, released, taken over, forged, or its row
    /// overwritten by another writer) changes nothing and answers `NotHeld`.
    async fn renew_one(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        let name = lease.name();
        if !lease_token_is_ours(lease.token()) {
            return Err(LockError::not_held(name));
        }
        let sent = Instant::now();
        let until = self.statement_until();
        let renew = || {
            retry_deadlocks(|| {
                let query = sqlx::query(AssertSqlSafe(self.sql.renew.clone()))
                    .bind(micros(ttl))
                    .bind(name.as_str().as_bytes())
                    .bind(lease.token().as_str().as_bytes())
                    .bind(lease.fence().get());
                execute_within(&self.pool, until, query)
            })
        };
        // Pooled connections the server closed since their last use (a restart) fail at once
        // and are closed; a renewal is idempotent, so it runs again on another (at most once
        // per pooled connection).
        let done = retry_broken(&self.pool, renew)
            .await
            .map_err(|e| LockError::from(Error::new(format!("renewing `{name}`"), e)))?;
        if changed_current(&done, lease) {
            Ok(Grant::new(lease.clone().with_ttl(ttl), sent))
        } else {
            Err(LockError::not_held(name))
        }
    }

    /// Renews every lease for its own TTL: one statement for a single lease (the watchdog's
    /// usual batch), else batches of one transaction each.
    pub(crate) async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(RENEW_BATCH) {
            let mut valid = Vec::with_capacity(chunk.len());
            let mut slots = Vec::with_capacity(chunk.len());
            for lease in chunk {
                match validate_ttl(lease.ttl()) {
                    Ok(()) => {
                        slots.push(None);
                        valid.push(lease);
                    }
                    Err(error) => slots.push(Some(Err(error))),
                }
            }
            let mut renewed = match valid.as_slice() {
                [] => Vec::new(),
                [lease] => vec![self.renew_one(lease, lease.ttl()).await],
                many => match self.renew_batch(many).await {
                    Ok(results) => results,
                    // A batch that failed as a whole fails the call, unless other chunks were
                    // or will be answered: then each lease of this chunk reports the failure
                    // (a refused statement stays a Backend error, not a retryable one).
                    Err(error) if leases.len() > RENEW_BATCH => {
                        let copy = || {
                            if error.is_retryable() {
                                LockError::unavailable_msg(error.to_string())
                            } else {
                                LockError::backend_msg(error.to_string())
                            }
                        };
                        many.iter().map(|_| Err(copy())).collect()
                    }
                    Err(error) => return Err(error),
                },
            }
            .into_iter();
            for slot in slots {
                out.push(match slot {
                    Some(invalid) => invalid,
                    None => renewed
                        .next()
                        .unwrap_or_else(|| Err(LockError::not_held("renewal batch"))),
                });
            }
        }
        Ok(out)
    }

    /// One transaction extending each lease (for its own TTL) that is still current, judged as
    /// a single renewal is: each `UPDATE` sets `LAST_INSERT_ID(fence)` on the row it changed
    /// (after resetting it to 0), and the `SELECT LAST_INSERT_ID()` after it reports that
    /// statement's own outcome, decided by the server when it ran (no re-read that a clock
    /// step between statements could mislead).
    async fn renew_batch(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let t = self.table.quoted();
        // Lock rows in one order (by name) so concurrent batches cannot deadlock.
        let mut order: Vec<(usize, &&Lease)> = leases
            .iter()
            .enumerate()
            .filter(|(_, lease)| lease_token_is_ours(lease.token()))
            .collect();
        order.sort_by(|(_, a), (_, b)| a.name().as_str().cmp(b.name().as_str()));
        let mut sql = String::from("START TRANSACTION; ");
        for (i, lease) in &order {
            let current = lease_current(
                &hex(lease.token().as_str().as_bytes()),
                &lease.fence().get().to_string(),
            );
            sql.push_str(&format!(
                "DO LAST_INSERT_ID(0); \
                 UPDATE {t} SET expires_at = NOW(6) + INTERVAL {} MICROSECOND, \
                 fence = LAST_INSERT_ID(fence) WHERE name = {} AND {current}; \
                 SELECT 'renewed', CAST({i} AS UNSIGNED), LAST_INSERT_ID(); ",
                micros(lease.ttl()),
                hex(lease.name().as_str().as_bytes()),
            ));
        }
        sql.push_str("COMMIT");
        let sent = Instant::now();
        let rows = run_pooled(&self.pool, sql, self.statement_until())
            .await
            .map_err(|e| LockError::from(Error::new("renewing leases", e)))?;
        let mut fences: HashMap<u64, u64> = HashMap::new();
        for row in tagged(&rows, "renewed") {
            let index: u64 = row
                .try_get(1)
                .map_err(|e| LockError::from(Error::new("reading renewal outcomes", e)))?;
            let fence: u64 = row
                .try_get(2)
                .map_err(|e| LockError::from(Error::new("reading renewal outcomes", e)))?;
            fences.insert(index, fence);
        }
        Ok(leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let fence = u64::try_from(i).ok().and_then(|i| fences.get(&i));
                if fence.is_some_and(|f| *f > 0 && *f == lease.fence().get()) {
                    Ok(Grant::new(Lease::clone(lease), sent))
                } else {
                    // Released, expired, taken over, or not a lease of this library (a
                    // foreign row, a forged token): not renewed, as a single renewal answers.
                    Err(LockError::not_held(lease.name()))
                }
            })
            .collect())
    }
}
