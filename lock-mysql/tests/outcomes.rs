//! The lease strategy judges the outcome of acquire, release and renewal from the value the
//! server returns with the statement (`LAST_INSERT_ID(fence ...)`, set only on the row it
//! changed) and from re-reading the row. These cases put a row in every state this library can meet,
//! run the operation, and check its answer against the row as read before and after by an
//! administrator's connection: a grant means the row now shows that grant; any other answer
//! means the row did not change.
//!
//! Needs `LOCK_TEST_MYSQL_URL` (`cargo xtask test` sets it); without it every case fails.

mod support;

use std::time::Duration;

use conformance_tests::{Cases, Failure, Outcome, ensure, faults::unique_name as name};
use lock_core::{
    Fence, Lease, LockBackend, LockError, LockName, LockOptions,
    backend::{AcquireRequest, Grant, LeaseToken},
};
use lock_mysql::{MySqlBackend, Strategy};
use sqlx::AssertSqlSafe;
use support::{MySqlStore, hex};

fn main() -> std::process::ExitCode {
    Cases::<Failure>::new("outcomes")
        .limit(Duration::from_secs(120))
        .case("lease/acquire_answer_matches_the_row", || {
            Box::pin(acquire_matches_row())
        })
        .case("lease/release_answer_matches_the_row", || {
            Box::pin(release_matches_row())
        })
        .case("lease/renew_answer_matches_the_row", || {
            Box::pin(renew_matches_row())
        })
        .case("lease/every_path_judges_a_row_alike", || {
            Box::pin(every_path_judges_alike())
        })
        .finally(support::drop_tables_after_cases)
        .main()
}

/// A row as an administrator reads it: hex token, fence, expiry, acquired_at, live.
type Snapshot = Option<(
    Option<String>,
    u64,
    Option<String>,
    Option<String>,
    Option<i64>,
)>;

async fn snapshot(store: &MySqlStore, name: &LockName) -> Result<Snapshot, Failure> {
    let table = store.config().table_name();
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT LOWER(HEX(token)), fence, CAST(expires_at AS CHAR(26)), \
         CAST(acquired_at AS CHAR(26)), expires_at > NOW(6) FROM `{table}` WHERE name = ?"
    )))
    .bind(name.as_str().as_bytes())
    .fetch_optional(store.admin())
    .await
    .map_err(|e| Failure(format!("reading the row: {e}")))
}

/// Ends the lease on `name` by the server clock, as if its TTL had passed (no sleeping).
/// A refused release or renewal: it must answer `NotHeld` and leave the row as it was.
fn refused_unchanged<T: std::fmt::Debug>(
    label: &str,
    answer: &Result<T, LockError>,
    before: &Snapshot,
    after: &Snapshot,
) -> Outcome {
    ensure!(
        matches!(answer, Err(LockError::NotHeld { .. })),
        "{label}: answered {answer:?}, expected NotHeld"
    );
    ensure!(
        after == before,
        "{label}: NotHeld, but the row changed from {before:?} to {after:?}"
    );
    Ok(())
}

async fn expire(store: &MySqlStore, name: &LockName) -> Outcome {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE `{}` SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE name = ?",
        store.config().table_name()
    )))
    .bind(name.as_str().as_bytes())
    .execute(store.admin())
    .await
    .map_err(|e| Failure(format!("expiring `{name}`: {e}")))?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Acquired(u64),
    Busy,
    Foreign,
}

const VALID: &str = "'0123456789abcdef0123456789abcdef'";

/// The rows `acquire` meets, each as the values after `name` in an `INSERT` (none: no row),
/// and what it must answer.
fn acquire_cases() -> [(&'static str, Option<String>, Expect); 11] {
    let past = "NOW(6) - INTERVAL 1 SECOND";
    [
        ("missing row", None, Expect::Acquired(1)),
        (
            "released",
            Some("NULL, 5, NULL, NOW(6)".into()),
            Expect::Acquired(6),
        ),
        (
            "released, never acquired",
            Some("NULL, 3, NULL, NULL".into()),
            Expect::Acquired(4),
        ),
        (
            "expired lease",
            Some(format!("{VALID}, 6, {past}, {past}")),
            Expect::Acquired(7),
        ),
        (
            "live lease",
            Some(format!("{VALID}, 7, NOW(6) + INTERVAL 1 HOUR, NOW(6)")),
            Expect::Busy,
        ),
        (
            "expired foreign token",
            Some(format!("'not-a-lock-mysql-token', 2, {past}, {past}")),
            Expect::Foreign,
        ),
        (
            "expired uppercase token",
            Some(format!(
                "'0123456789ABCDEF0123456789ABCDEF', 2, {past}, {past}"
            )),
            Expect::Foreign,
        ),
        (
            "token without expiry",
            Some(format!("{VALID}, 2, NULL, {past}")),
            Expect::Foreign,
        ),
        (
            "expiry without token",
            Some(format!("NULL, 2, {past}, {past}")),
            Expect::Foreign,
        ),
        (
            "expired, no acquired_at",
            Some(format!("{VALID}, 2, {past}, NULL")),
            Expect::Foreign,
        ),
        (
            "released, fence at its maximum",
            Some("NULL, 18446744073709551615, NULL, NULL".into()),
            Expect::Foreign,
        ),
    ]
}

async fn acquire_matches_row() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let backend = MySqlBackend::connect(store.config()).await?;
    store.record_places().await.map_err(Failure)?;
    let table = store.config().table_name();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::ZERO);
    for (label, setup, expect) in acquire_cases() {
        let name = name("acquire")?;
        if let Some(values) = setup {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO `{table}` (name, token, fence, expires_at, acquired_at) VALUES (?, {values})"
            )))
            .bind(name.as_str().as_bytes())
            .execute(store.admin())
            .await
            .map_err(|e| Failure(format!("{label}: setting up: {e}")))?;
        }
        let before = snapshot(&store, &name).await?;
        let request = AcquireRequest::new(name.clone(), &options)?;
        let answer = backend.acquire(&request).await;
        let after = snapshot(&store, &name).await?;
        judge_acquire(label, &answer, expect, &before, &after)?;
        // A grant comes from the statement's reply alone: no place in the waiters' queue was
        // taken (and left to be removed in the background, where it can stand in the way of
        // the next acquirer once the lease is over). Counted as written, not as left: a place
        // removed in the background may be gone already, or not yet.
        let places = store.places_written(&name).await.map_err(Failure)?;
        ensure!(
            answer.is_err() || places == 0,
            "{label}: granted, but the grant took {places} place(s) in the waiters' queue"
        );
    }
    Ok(())
}

/// An acquire's `answer` against what was `expect`ed and the row `before` and `after` it: a
/// grant with the expected fence that the row shows, or a refusal that left the row as it was.
fn judge_acquire(
    label: &str,
    answer: &Result<Grant, LockError>,
    expect: Expect,
    before: &Snapshot,
    after: &Snapshot,
) -> Outcome {
    match (answer, expect) {
        (Ok(grant), Expect::Acquired(fence)) => {
            ensure!(
                grant.lease.fence() == Fence::new(fence),
                "{label}: granted fence {}, expected {fence}",
                grant.lease.fence()
            );
            let shows = after.as_ref().is_some_and(|(token, f, _, acquired, live)| {
                token.as_deref() == Some(hex(grant.lease.token().as_str()).as_str())
                    && *f == fence
                    && acquired.is_some()
                    && *live == Some(1)
            });
            ensure!(
                shows,
                "{label}: granted, but the row shows {after:?} (before {before:?})"
            );
        }
        (Err(LockError::Timeout { .. }), Expect::Busy)
        | (Err(LockError::Foreign { .. }), Expect::Foreign) => {
            ensure!(
                after == before,
                "{label}: refused ({answer:?}), but the row changed from {before:?} to {after:?}"
            );
        }
        _ => {
            return Err(Failure(format!(
                "{label}: answered {answer:?}, expected {expect:?}; row {before:?} -> {after:?}"
            )));
        }
    }
    Ok(())
}

/// A lease of `name` from `backend` (no watchdog: these cases call the backend directly).
async fn acquire_lease(
    backend: &MySqlBackend,
    name: &LockName,
    options: &LockOptions,
) -> Result<Lease, Failure> {
    let request = AcquireRequest::new(name.clone(), options)?;
    Ok(backend.acquire(&request).await?.lease)
}

async fn release_matches_row() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let backend = MySqlBackend::connect(store.config()).await?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::ZERO);
    // Each release must answer NotHeld and leave the row as it was, or answer Ok and leave
    // it released with the same fence.
    async fn check(
        store: &MySqlStore,
        backend: &MySqlBackend,
        label: &str,
        lease: &Lease,
        ok: bool,
    ) -> Outcome {
        let before = snapshot(store, lease.name()).await?;
        let answer = backend.release(lease).await;
        let after = snapshot(store, lease.name()).await?;
        if ok {
            ensure!(answer.is_ok(), "{label}: answered {answer:?}, expected Ok");
            let released = after.as_ref().is_some_and(|(token, fence, expires, _, _)| {
                token.is_none() && expires.is_none() && *fence == lease.fence().get()
            });
            ensure!(released, "{label}: Ok, but the row shows {after:?}");
        } else {
            refused_unchanged(label, &answer, &before, &after)?;
        }
        Ok(())
    }

    let name1 = name("release")?;
    let lease = acquire_lease(&backend, &name1, &options).await?;
    let forged = Lease::new(
        name1.clone(),
        LeaseToken::random(),
        lease.fence(),
        lease.ttl(),
    );
    check(&store, &backend, "forged token", &forged, false).await?;
    let wrong_fence = Lease::new(
        name1.clone(),
        lease.token().clone(),
        Fence::new(lease.fence().get() + 1),
        lease.ttl(),
    );
    check(&store, &backend, "wrong fence", &wrong_fence, false).await?;
    check(&store, &backend, "current lease", &lease, true).await?;
    check(&store, &backend, "released again", &lease, false).await?;

    let name2 = name("release-expired")?;
    let expired = acquire_lease(&backend, &name2, &options).await?;
    expire(&store, &name2).await?;
    check(&store, &backend, "expired lease", &expired, false).await?;

    let name3 = name("release-taken-over")?;
    let old = acquire_lease(&backend, &name3, &options).await?;
    expire(&store, &name3).await?;
    let new = acquire_lease(&backend, &name3, &options).await?;
    ensure!(new.fence() > old.fence(), "no takeover after expiry");
    check(&store, &backend, "lease taken over", &old, false).await?;
    check(&store, &backend, "the new holder's lease", &new, true).await?;
    Ok(())
}

/// How a lease is renewed: `renew` (one statement), `renew_many` of it alone (one statement as
/// well), or `renew_many` of it after another current lease (one batch transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    One,
    Many,
    Batch,
}

async fn renew_matches_row() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let backend = MySqlBackend::connect(store.config()).await?;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::ZERO);
    let companion = acquire_lease(&backend, &name("renew-companion")?, &options).await?;
    let renewing = Renewing {
        store,
        backend,
        companion,
        options,
    };
    for how in [Renewal::One, Renewal::Many, Renewal::Batch] {
        renewing.every_lease(how).await?;
    }
    renewing.backend.release(&renewing.companion).await?;
    Ok(())
}

/// What the renewal checks share.
struct Renewing {
    store: MySqlStore,
    backend: MySqlBackend,
    /// Renewed beside each lease in a batch; it must be renewed every time.
    companion: Lease,
    /// How leases are acquired.
    options: LockOptions,
}

impl Renewing {
    async fn acquire(&self, name: &LockName) -> Result<Lease, Failure> {
        acquire_lease(&self.backend, name, &self.options).await
    }

    /// Renews (`how`) every lease a caller may present: forged, of the wrong fence, current,
    /// released, expired, taken over, the new holder's, and one whose row another writer
    /// overwrote; only the current ones are renewed.
    async fn every_lease(&self, how: Renewal) -> Outcome {
        let name1 = name("renew")?;
        let lease = self.acquire(&name1).await?;
        let forged = Lease::new(
            name1.clone(),
            LeaseToken::random(),
            lease.fence(),
            lease.ttl(),
        );
        self.check(how, "forged token", &forged, false).await?;
        let wrong_fence = Lease::new(
            name1.clone(),
            lease.token().clone(),
            Fence::new(lease.fence().get() + 1),
            lease.ttl(),
        );
        self.check(how, "wrong fence", &wrong_fence, false).await?;
        self.check(how, "current lease", &lease, true).await?;
        self.backend.release(&lease).await?;
        self.check(how, "released lease", &lease, false).await?;

        let name2 = name("renew-expired")?;
        let expired = self.acquire(&name2).await?;
        expire(&self.store, &name2).await?;
        self.check(how, "expired lease", &expired, false).await?;

        let name3 = name("renew-taken-over")?;
        let old = self.acquire(&name3).await?;
        expire(&self.store, &name3).await?;
        let new = self.acquire(&name3).await?;
        ensure!(new.fence() > old.fence(), "no takeover after expiry");
        self.check(how, "lease taken over", &old, false).await?;
        self.check(how, "the new holder's lease", &new, true)
            .await?;

        // Another writer put its own value in the row while the lease was live.
        let name4 = name("renew-overwritten")?;
        let overwritten = self.acquire(&name4).await?;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE `{}` SET token = 'not-a-lock-mysql-token' WHERE name = ?",
            self.store.config().table_name()
        )))
        .bind(name4.as_str().as_bytes())
        .execute(self.store.admin())
        .await
        .map_err(|e| Failure(format!("overwriting the row: {e}")))?;
        self.check(
            how,
            "row overwritten by another writer",
            &overwritten,
            false,
        )
        .await
    }

    /// Each renewal must answer NotHeld and leave the row as it was, or (`ok`) answer Ok and
    /// leave it with the same token and fence and a later, live expiry.
    async fn check(&self, how: Renewal, label: &str, lease: &Lease, ok: bool) -> Outcome {
        let label = format!("{how:?}: {label}");
        let ttl = Duration::from_secs(60);
        let before = snapshot(&self.store, lease.name()).await?;
        let answer = self.renew(how, &label, lease, ttl).await?;
        let after = snapshot(&self.store, lease.name()).await?;
        if ok {
            ensure!(
                answer.as_ref().is_ok_and(|grant| grant.lease.ttl() == ttl
                    && grant.lease.token() == lease.token()
                    && grant.lease.fence() == lease.fence()),
                "{label}: answered {answer:?}, expected a renewal of {lease:?} for {ttl:?}"
            );
            let extended = match (&before, &after) {
                (Some((t0, f0, Some(e0), a0, _)), Some((t1, f1, Some(e1), a1, live))) => {
                    t1 == t0 && f1 == f0 && a1 == a0 && e1 > e0 && *live == Some(1)
                }
                _ => false,
            };
            ensure!(
                extended,
                "{label}: Ok, but the row went from {before:?} to {after:?}"
            );
        } else {
            refused_unchanged(&label, &answer, &before, &after)?;
        }
        Ok(())
    }

    /// Renews `lease` for `ttl` the way `how` says; the answer for `lease`.
    async fn renew(
        &self,
        how: Renewal,
        label: &str,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Result<Grant, LockError>, Failure> {
        if how == Renewal::One {
            return Ok(self.backend.renew(lease, ttl).await);
        }
        let mut leases = vec![lease.clone().with_ttl(ttl)];
        if how == Renewal::Batch {
            leases.insert(0, self.companion.clone().with_ttl(ttl));
        }
        let mut answers = match self.backend.renew_many(&leases).await {
            Ok(answers) => answers,
            // A batch of one that failed as a whole: that is the lease's answer. Beside a
            // current companion, the batch must not fail as a whole.
            Err(error) if how != Renewal::Batch => return Ok(Err(error)),
            Err(error) => {
                return Err(Failure(format!(
                    "{label}: the batch with a current companion failed as a whole: {error}"
                )));
            }
        };
        ensure!(
            answers.len() == leases.len(),
            "{label}: {} answers for {} leases",
            answers.len(),
            leases.len()
        );
        if how == Renewal::Batch {
            ensure!(
                answers[0].is_ok(),
                "{label}: the current companion lease was not renewed: {:?}",
                answers[0]
            );
        }
        answers
            .pop()
            .ok_or_else(|| Failure(format!("{label}: no answer")))
    }
}

/// One judgment of a row in every path: a row `acquire` calls foreign is never renewed nor
/// released (single or batched: `NotHeld`, the row unchanged), whoever presents a lease
/// matching it; and a lease of ours at the top fence is a lease, for `inspect` as for renewal.
async fn every_path_judges_alike() -> Outcome {
    let store = MySqlStore::new(Strategy::Lease).await.map_err(Failure)?;
    let backend = MySqlBackend::connect(store.config()).await?;
    let live = "NOW(6) + INTERVAL 1 HOUR";
    // Rows acquire calls foreign, each with the lease a caller could present for it.
    let foreign: [(&str, String, &str, u64); 2] = [
        (
            "a foreign token, live",
            format!("'not-a-lock-mysql-token', 7, {live}, NOW(6)"),
            "not-a-lock-mysql-token",
            7,
        ),
        (
            "our token shape, no acquired_at, live",
            format!("{VALID}, 7, {live}, NULL"),
            "0123456789abcdef0123456789abcdef",
            7,
        ),
    ];
    for (label, values, token, fence) in foreign {
        let name = name("judge")?;
        plant(&store, &name, &values).await?;
        let lease = Lease::new(
            name,
            LeaseToken::from_store(token),
            Fence::new(fence),
            Duration::from_secs(30),
        );
        foreign_row_is_nobodys(&store, &backend, label, &lease).await?;
    }
    top_fence_is_a_lease(&store, &backend).await
}

/// Plants a row for `name` with `values` (token, fence, expires_at, acquired_at).
async fn plant(store: &MySqlStore, name: &LockName, values: &str) -> Outcome {
    let table = store.config().table_name();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO `{table}` (name, token, fence, expires_at, acquired_at) VALUES (?, {values})"
    )))
    .bind(name.as_str().as_bytes())
    .execute(store.admin())
    .await
    .map_err(|e| Failure(format!("planting a row: {e}")))?;
    Ok(())
}

/// The planted row of `lease`'s name is foreign to `acquire`; so the `lease` that matches it
/// is refused by `renew`, by a batched renewal beside a lease of ours (which is renewed) and
/// by `release`, each `NotHeld` with the row unchanged.
async fn foreign_row_is_nobodys(
    store: &MySqlStore,
    backend: &MySqlBackend,
    label: &str,
    lease: &Lease,
) -> Outcome {
    let (name, ttl) = (lease.name(), lease.ttl());
    let request = AcquireRequest::new(name.clone(), &LockOptions::new().ttl(ttl))?;
    let acquired = backend.acquire(&request).await;
    ensure!(
        matches!(acquired, Err(LockError::Foreign { .. })),
        "{label}: acquire answered {acquired:?}, expected Foreign"
    );
    let before = snapshot(store, name).await?;
    let renewed = backend.renew(lease, ttl).await;
    refused_unchanged(
        &format!("{label}: renew"),
        &renewed,
        &before,
        &snapshot(store, name).await?,
    )?;
    // In a batch with a lease of ours.
    let other = crate::name("judge-ours")?;
    let ours = backend
        .acquire(&AcquireRequest::new(
            other.clone(),
            &LockOptions::new().ttl(ttl),
        )?)
        .await?;
    let batch = backend
        .renew_many(&[lease.clone(), ours.lease.clone()])
        .await
        .map_err(|e| Failure(format!("{label}: the batch failed as a whole: {e}")))?;
    ensure!(
        batch.len() == 2,
        "{label}: {} answers for 2 leases",
        batch.len()
    );
    refused_unchanged(
        &format!("{label}: batched renewal"),
        &batch[0],
        &before,
        &snapshot(store, name).await?,
    )?;
    ensure!(
        batch[1].is_ok(),
        "{label}: our lease in the same batch: {:?}",
        batch[1]
    );
    let released = backend.release(lease).await;
    refused_unchanged(
        &format!("{label}: release"),
        &released,
        &before,
        &snapshot(store, name).await?,
    )?;
    backend.release(&ours.lease).await?;
    Ok(())
}

/// Our own lease at the top fence (taken over from fence max - 1) is a lease, for `inspect`
/// as for renewal; released there, no fence is left to issue, so acquire refuses it.
async fn top_fence_is_a_lease(store: &MySqlStore, backend: &MySqlBackend) -> Outcome {
    let ttl = Duration::from_secs(30);
    let name = name("top-fence")?;
    let past = "NOW(6) - INTERVAL 1 SECOND";
    plant(
        store,
        &name,
        &format!("{VALID}, 18446744073709551614, {past}, {past}"),
    )
    .await?;
    let grant = backend
        .acquire(&AcquireRequest::new(
            name.clone(),
            &LockOptions::new().ttl(ttl),
        )?)
        .await?;
    ensure!(
        grant.lease.fence() == Fence::new(u64::MAX),
        "the takeover issued fence {}",
        grant.lease.fence()
    );
    let info = backend.inspect(&name).await;
    ensure!(
        matches!(&info, Ok(Some(i)) if i.token == *grant.lease.token() && i.fence == grant.lease.fence()),
        "inspect of our lease at the top fence answered {info:?}"
    );
    backend.renew(&grant.lease, ttl).await?;
    backend.release(&grant.lease).await?;
    // Released at the top fence: no fence is left to issue, so acquire refuses it.
    let again = backend
        .acquire(&AcquireRequest::new(
            name.clone(),
            &LockOptions::new().ttl(ttl),
        )?)
        .await;
    ensure!(
        matches!(&again, Err(LockError::Foreign { found, .. }) if found.contains("maximum")),
        "acquire of a released row at the top fence answered {again:?}"
    );
    Ok(())
}
