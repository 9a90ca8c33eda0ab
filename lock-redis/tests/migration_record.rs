//! The migration record on a real server: shared by every client (two backends here, as two
//! processes would be), moved forward only by compare-and-set, and read by the phases a
//! fleet runs in (`new` refuses to start before the flip).
//!
//! Needs `LOCK_TEST_REDIS_URL` (`cargo xtask test` sets it).

use std::{process::ExitCode, sync::Arc, time::Duration};

use conformance_tests::{Cases, Failure, Outcome, ensure, faults::env_var};
use lock_core::{
    LockBackend, LockClient, LockError, MemoryBackend,
    migrate::{Authority, MigratingBackend, MigrationRecord, Phase, Record},
};
use lock_redis::{RedisBackend, RedisConfig};

fn main() -> ExitCode {
    Cases::<Failure>::new("migration_record")
        .limit(Duration::from_secs(60))
        .case("shared_and_forward_only", || {
            Box::pin(shared_and_forward_only())
        })
        .main()
}

async fn backend(prefix: &str) -> Result<RedisBackend, Failure> {
    let url = env_var("LOCK_TEST_REDIS_URL")?;
    let config: RedisConfig = format!("{url}?prefix={prefix}").parse()?;
    Ok(RedisBackend::connect(config).await?)
}

async fn shared_and_forward_only() -> Outcome {
    let prefix = format!("record-{:08x}", rand::random::<u32>());
    let (one, two) = (backend(&prefix).await?, backend(&prefix).await?);
    let (a, b) = (one.migration_record()?, two.migration_record()?);
    let missing = a.read().await;
    ensure!(
        matches!(missing, Err(LockError::Backend { .. })),
        "a record nobody started reads {missing:?}"
    );
    let start = a.start().await?;
    ensure!(b.start().await? == start, "a second start moved the record");
    ensure!(
        start
            == Record {
                generation: 0,
                authority: Authority::From
            },
        "a new record reads {start:?}"
    );
    // A `new` client cannot start yet.
    let from: Arc<dyn LockBackend> = Arc::new(one.clone());
    let to: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let early =
        MigratingBackend::new(from.clone(), to.clone(), Arc::new(b.clone()), Phase::New).await;
    ensure!(
        matches!(early, Err(LockError::InvalidOptions { .. })),
        "a new client started early"
    );
    let dual = LockClient::new(
        MigratingBackend::new(from.clone(), to.clone(), Arc::new(b.clone()), Phase::Dual).await?,
    );
    let before = dual.lock("jobs/a").await?;
    let fence_before = before.fence();
    before.release().await?;

    // The flip through one client's record is seen through the other's.
    let flipped = Record {
        authority: Authority::To,
        ..start
    };
    conformance_tests::migration::flip(&a).await?;
    ensure!(
        b.read().await? == flipped,
        "the other client does not see the flip"
    );
    ensure!(
        !b.advance(&start, &flipped).await?,
        "a stale compare-and-set moved the record"
    );
    let back = b.advance(&flipped, &start).await;
    ensure!(
        matches!(back, Err(LockError::InvalidOptions { .. })),
        "the record went back: {back:?}"
    );
    let after = dual.lock("jobs/a").await?;
    ensure!(
        after.fence() > fence_before,
        "fence {} after the flip, {fence_before} before",
        after.fence()
    );
    after.release().await?;
    MigratingBackend::new(from, to, Arc::new(b), Phase::New).await?;
    Ok(())
}
