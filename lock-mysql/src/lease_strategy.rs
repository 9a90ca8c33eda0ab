//! The lease strategy: one row per lock with the holder's token, fence and expiry.
//!
//! Every operation is one transaction sent as one batch (see [`script`](crate::script)):
//! it locks the row with `SELECT ... FOR UPDATE`, changes it only under a condition evaluated
//! by the server against `NOW(6)`, and reads the row back; the client judges the outcome from
//! what it reads, never from `rows_affected` (sqlx sets `CLIENT_FOUND_ROWS`) and never from its
//! own clock. Released rows stay, with token and expiry NULL, so the fence never goes back.

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime},
};

use lock_core::{
    AcquireRequest, Attempt, Grant, Lease, LeaseToken, LockError, LockInfo, LockName,
    poll_until_acquired, validate_ttl,
};
use sqlx::{MySqlPool, Row, mysql::MySqlRow};

use crate::{
    TableName,
    error::{Class, classify, lock_error},
    lock_row::{LEASE_COLUMNS, LEASE_TAKEABLE, LeaseRow, LeaseState},
    script::{hex, run_pooled, tagged},
};

/// Leases renewed by one batch at most (a longer list is split).
const RENEW_BATCH: usize = 100;

/// The lease strategy over one pool and table.
#[derive(Debug, Clone)]
pub(crate) struct LeaseStrategy {
    pool: MySqlPool,
    table: TableName,
}

impl LeaseStrategy {
    pub(crate) fn new(pool: MySqlPool, table: TableName) -> Self {
        Self { pool, table }
    }

    /// Acquires by polling: one batch per try, jittered back-off between tries bounded by the
    /// holder's remaining TTL as the server reports it.
    pub(crate) async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        validate_ttl(request.ttl())?;
        poll_until_acquired(request, || self.try_once(request)).await
    }

    /// One try: insert the row, or take it over if it is released or expired.
    async fn try_once(&self, request: &AcquireRequest) -> Result<Attempt, LockError> {
        let name = request.name();
        let token = LeaseToken::random();
        let t = self.table.quoted();
        let n = hex(name.as_str().as_bytes());
        let k = hex(token.as_str().as_bytes());
        let ttl = micros(request.ttl());
        let sql = format!(
            "ROLLBACK; START TRANSACTION; \
             SELECT 'before', {LEASE_COLUMNS} FROM {t} WHERE name = {n} FOR UPDATE; \
             INSERT INTO {t} (name, token, fence, expires_at, acquired_at) \
               VALUES ({n}, {k}, 1, NOW(6) + INTERVAL {ttl} MICROSECOND, NOW(6)) \
               ON DUPLICATE KEY UPDATE name = name; \
             UPDATE {t} SET fence = fence + 1, token = {k}, \
               expires_at = NOW(6) + INTERVAL {ttl} MICROSECOND, acquired_at = NOW(6) \
               WHERE name = {n} AND {LEASE_TAKEABLE}; \
             SELECT 'after', {LEASE_COLUMNS} FROM {t} WHERE name = {n}; \
             COMMIT"
        );
        let sent = Instant::now();
        let rows = match run_pooled(&self.pool, sql).await {
            Ok(rows) => rows,
            // Someone kept the row locked past innodb_lock_wait_timeout: busy, try again later.
            Err(error) if classify(&error) == Class::LockWait => {
                return Ok(Attempt::Busy { expires_in: None });
            }
            Err(error) => return Err(lock_error(&format!("acquiring `{name}`"), error)),
        };
        let before = self.state(&rows, "before", name)?;
        let after = self.state(&rows, "after", name)?;
        if let Some(LeaseState::Held {
            token: held,
            fence,
            remaining_us,
            expires_epoch_us,
        }) = &after
            && *held == token
            && *remaining_us > 0
        {
            let lease = lease(name, token, *fence, request.ttl(), *expires_epoch_us);
            return Ok(Attempt::Acquired(Grant::new(lease, sent)));
        }
        // Not ours: say how long the holder has left (from the row as it was when locked,
        // else as it is now, when another client created it meanwhile).
        let expires_in = match before.or(after) {
            Some(LeaseState::Held { remaining_us, .. }) => Some(Duration::from_micros(
                u64::try_from(remaining_us).unwrap_or(0),
            )),
            _ => None,
        };
        Ok(Attempt::Busy { expires_in })
    }

    /// The judged state of the row tagged `tag` in `rows`, `None` when there is none.
    fn state(
        &self,
        rows: &[MySqlRow],
        tag: &str,
        name: &LockName,
    ) -> Result<Option<LeaseState>, LockError> {
        tagged(rows, tag)
            .next()
            .map(|row| {
                LeaseRow::read(row, 1)
                    .map_err(|e| lock_error(&format!("reading the row of `{name}`"), e))?
                    .judge(&self.table, name)
            })
            .transpose()
    }

    pub(crate) async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        validate_ttl(ttl)?;
        let mut results = self.renew_batch(&[(lease, ttl)]).await?;
        results
            .pop()
            .unwrap_or_else(|| Err(LockError::not_held(lease.name())))
    }

    /// Renews every lease for its own TTL in batches of one transaction each.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Grant, LockError>> {
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(RENEW_BATCH) {
            let mut valid = Vec::with_capacity(chunk.len());
            let mut slots = Vec::with_capacity(chunk.len());
            for lease in chunk {
                match validate_ttl(lease.ttl()) {
                    Ok(()) => {
                        slots.push(None);
                        valid.push((lease, lease.ttl()));
                    }
                    Err(error) => slots.push(Some(Err(error))),
                }
            }
            let mut renewed = match self.renew_batch(&valid).await {
                Ok(results) => results.into_iter(),
                Err(error) => {
                    let message = error.to_string();
                    let failed: Vec<_> = valid
                        .iter()
                        .map(|_| {
                            Err(LockError::Unavailable {
                                message: message.clone(),
                                source: None,
                            })
                        })
                        .collect();
                    failed.into_iter()
                }
            };
            for slot in slots {
                out.push(match slot {
                    Some(invalid) => invalid,
                    None => renewed
                        .next()
                        .unwrap_or_else(|| Err(LockError::not_held("renewal batch"))),
                });
            }
        }
        out
    }

    /// One transaction extending each lease that is still current, then reading the rows
    /// back: a lease is renewed if its row shows its token with time left.
    async fn renew_batch(
        &self,
        leases: &[(&Lease, Duration)],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let t = self.table.quoted();
        // Lock rows in one order (by name) so concurrent batches cannot deadlock.
        let mut order: Vec<_> = leases.iter().collect();
        order.sort_by(|a, b| a.0.name().as_str().cmp(b.0.name().as_str()));
        let mut sql = String::from("ROLLBACK; START TRANSACTION; ");
        let mut names = Vec::with_capacity(leases.len());
        for (lease, ttl) in order {
            let n = hex(lease.name().as_str().as_bytes());
            sql.push_str(&format!(
                "UPDATE {t} SET expires_at = NOW(6) + INTERVAL {} MICROSECOND \
                 WHERE name = {n} AND token = {} AND fence = {} AND expires_at > NOW(6); ",
                micros(*ttl),
                hex(lease.token().as_str().as_bytes()),
                lease.fence().get(),
            ));
            names.push(n);
        }
        sql.push_str(&format!(
            "SELECT 'after', name, {LEASE_COLUMNS} FROM {t} WHERE name IN ({}); COMMIT",
            names.join(", ")
        ));
        let sent = Instant::now();
        let rows = run_pooled(&self.pool, sql)
            .await
            .map_err(|e| lock_error("renewing leases", e))?;
        let mut by_name: HashMap<Vec<u8>, &MySqlRow> = HashMap::new();
        for row in tagged(&rows, "after") {
            let name: Vec<u8> = row
                .try_get(1)
                .map_err(|e| lock_error("reading renewed rows", e))?;
            by_name.insert(name, row);
        }
        Ok(leases
            .iter()
            .map(|(lease, ttl)| {
                let row = by_name
                    .get(lease.name().as_str().as_bytes())
                    .ok_or_else(|| LockError::not_held(lease.name()))?;
                let state = LeaseRow::read(row, 2)
                    .map_err(|e| lock_error(&format!("reading the row of `{}`", lease.name()), e))?
                    .judge(&self.table, lease.name())?;
                match state {
                    LeaseState::Held {
                        token,
                        fence,
                        remaining_us,
                        expires_epoch_us,
                    } if token == *lease.token() && fence == lease.fence() && remaining_us > 0 => {
                        let renewed =
                            self::lease(lease.name(), token, fence, *ttl, expires_epoch_us);
                        Ok(Grant::new(renewed, sent))
                    }
                    _ => Err(LockError::not_held(lease.name())),
                }
            })
            .collect())
    }

    /// Releases `lease` if it is current: the row before the change must show its token with
    /// time left, and after it no token.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let name = lease.name();
        let t = self.table.quoted();
        let n = hex(name.as_str().as_bytes());
        let k = hex(lease.token().as_str().as_bytes());
        let sql = format!(
            "ROLLBACK; START TRANSACTION; \
             SELECT 'before', {LEASE_COLUMNS} FROM {t} WHERE name = {n} FOR UPDATE; \
             UPDATE {t} SET token = NULL, expires_at = NULL \
               WHERE name = {n} AND token = {k} AND fence = {f} AND expires_at > NOW(6); \
             SELECT 'after', {LEASE_COLUMNS} FROM {t} WHERE name = {n}; \
             COMMIT",
            f = lease.fence().get(),
        );
        let rows = run_pooled(&self.pool, sql)
            .await
            .map_err(|e| lock_error(&format!("releasing `{name}`"), e))?;
        let before = self.state(&rows, "before", name)?;
        let after = self.state(&rows, "after", name)?;
        let was_current = matches!(
            &before,
            Some(LeaseState::Held { token, fence, remaining_us, .. })
                if token == lease.token() && *fence == lease.fence() && *remaining_us > 0
        );
        if was_current && after == Some(LeaseState::Free) {
            Ok(())
        } else {
            Err(LockError::not_held(name))
        }
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        let sql = format!(
            "SELECT 'row', {LEASE_COLUMNS} FROM {} WHERE name = {}",
            self.table.quoted(),
            hex(name.as_str().as_bytes())
        );
        let rows = run_pooled(&self.pool, sql)
            .await
            .map_err(|e| lock_error(&format!("inspecting `{name}`"), e))?;
        Ok(match self.state(&rows, "row", name)? {
            Some(LeaseState::Held {
                token,
                fence,
                remaining_us,
                ..
            }) if remaining_us > 0 => Some(LockInfo::new(
                name.clone(),
                token,
                fence,
                Some(Duration::from_micros(remaining_us.unsigned_abs())),
            )),
            _ => None,
        })
    }
}

/// A lease as the server granted it: the expiry instant is the server's.
fn lease(
    name: &LockName,
    token: LeaseToken,
    fence: lock_core::Fence,
    ttl: Duration,
    expires_epoch_us: Option<i64>,
) -> Lease {
    let lease = Lease::new(name.clone(), token, fence, ttl);
    match expires_epoch_us.and_then(|us| u64::try_from(us).ok()) {
        Some(us) => lease.with_expires_at(SystemTime::UNIX_EPOCH + Duration::from_micros(us)),
        None => lease,
    }
}

/// A TTL in whole microseconds (TTLs are at most a day: no overflow).
fn micros(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX)
}
