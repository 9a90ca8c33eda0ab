//! The lease strategy's renewals: one prepared statement for one lease, one transaction for
//! a batch.

use std::{
    collections::{BTreeMap, HashSet},
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
    rows::lease_token_is_ours,
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

    /// One transaction extending each lease (for its own TTL) that is still current: per TTL
    /// in the batch (the watchdog's batches have one), an `UPDATE` of the live rows that match
    /// a lease (name, token and fence) to end at one instant read once (`@lock_renew_now`)
    /// plus the TTL, then a `SELECT` of the rows of those names that end exactly then. The
    /// rows the `UPDATE` extended are locked until the `COMMIT` and end then; a row it did not
    /// extend ends then only if another renewal of the same lease wrote that very end (the
    /// same instant to the microsecond, the same TTL), which renews it as much. A row another
    /// renewal extended and committed after the `UPDATE` passed it over ends at another
    /// instant: not counted, as it was not this renewal's. So the answer is this statement's
    /// own outcome, with no second reading of the clock. Five statements for a batch of one
    /// TTL, however many leases.
    async fn renew_batch(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        let t = self.table.quoted();
        // Leases by TTL; the rows of each `UPDATE` are locked in the primary key's order, so
        // concurrent batches cannot deadlock.
        let mut by_ttl: BTreeMap<u64, Vec<&Lease>> = BTreeMap::new();
        for lease in leases
            .iter()
            .filter(|lease| lease_token_is_ours(lease.token()))
        {
            by_ttl.entry(micros(lease.ttl())).or_default().push(lease);
        }
        let mut sql = String::from("START TRANSACTION; SET @lock_renew_now = NOW(6); ");
        for (ttl, group) in &by_ttl {
            let names = group
                .iter()
                .map(|lease| hex(lease.name().as_str().as_bytes()))
                .collect::<Vec<_>>()
                .join(", ");
            let keys = group
                .iter()
                .map(|lease| {
                    format!(
                        "({}, {}, {})",
                        hex(lease.name().as_str().as_bytes()),
                        hex(lease.token().as_str().as_bytes()),
                        lease.fence().get()
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let end = format!("@lock_renew_now + INTERVAL {ttl} MICROSECOND");
            sql.push_str(&format!(
                "UPDATE {t} SET expires_at = {end} \
                 WHERE name IN ({names}) AND (name, token, fence) IN ({keys}) \
                 AND acquired_at IS NOT NULL AND expires_at > @lock_renew_now; \
                 SELECT 'renewed', name, token, fence, CAST({ttl} AS UNSIGNED) FROM {t} \
                 WHERE name IN ({names}) AND acquired_at IS NOT NULL AND expires_at = {end}; "
            ));
        }
        sql.push_str("COMMIT");
        let sent = Instant::now();
        let rows = run_pooled(&self.pool, sql, self.statement_until())
            .await
            .map_err(|e| LockError::from(Error::new("renewing leases", e)))?;
        let mut renewed: HashSet<(Vec<u8>, Vec<u8>, u64, u64)> = HashSet::new();
        for row in tagged(&rows, "renewed") {
            let read = || -> Result<_, sqlx::Error> {
                Ok((
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                ))
            };
            renewed.insert(
                read().map_err(|e| LockError::from(Error::new("reading renewal outcomes", e)))?,
            );
        }
        Ok(leases
            .iter()
            .map(|lease| {
                let key = (
                    lease.name().as_str().as_bytes().to_vec(),
                    lease.token().as_str().as_bytes().to_vec(),
                    lease.fence().get(),
                    micros(lease.ttl()),
                );
                if lease_token_is_ours(lease.token()) && renewed.contains(&key) {
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
