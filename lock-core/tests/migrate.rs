//! A migration's record and phases: `new` clients refuse to start before the flip, `old`
//! ones after it, and the record never goes back. The mixed-fleet proof (every pair of
//! stores, with its negative controls) is `conformance_tests::migration`, run by
//! distributed-lock's `tests/migration.rs`.

#![allow(clippy::unwrap_used)] // test set-up: a failure is the test's

use std::sync::Arc;

use lock_core::{
    LockBackend, LockError, MemoryBackend,
    migrate::{Authority, MemoryRecord, MigratingBackend, MigrationRecord, Phase, Record},
};

struct Stores {
    from: Arc<dyn LockBackend>,
    to: Arc<dyn LockBackend>,
    record: Arc<MemoryRecord>,
}

impl Stores {
    fn new() -> Self {
        Self {
            from: Arc::new(MemoryBackend::new()),
            to: Arc::new(MemoryBackend::new()),
            record: Arc::new(MemoryRecord::new(0)),
        }
    }

    async fn flip(&self) {
        let now = self.record.read().await.unwrap();
        let next = Record {
            authority: Authority::To,
            ..now
        };
        assert!(self.record.advance(&now, &next).await.unwrap());
    }
}

#[tokio::test]
async fn phases_that_must_not_start_refuse_to() {
    let stores = Stores::new();
    let early = MigratingBackend::new(
        stores.from.clone(),
        stores.to.clone(),
        stores.record.clone(),
        Phase::New,
    )
    .await;
    assert!(
        matches!(early, Err(LockError::InvalidOptions { .. })),
        "{early:?}"
    );
    stores.flip().await;
    let late = MigratingBackend::new(
        stores.from.clone(),
        stores.to.clone(),
        stores.record.clone(),
        Phase::Old,
    )
    .await;
    assert!(
        matches!(late, Err(LockError::InvalidOptions { .. })),
        "{late:?}"
    );
    let now = stores.record.read().await.unwrap();
    let back = Record {
        authority: Authority::From,
        ..now
    };
    assert!(
        stores.record.advance(&now, &back).await.is_err(),
        "the record went back"
    );
}
