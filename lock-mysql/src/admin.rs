//! [`LockAdmin`] for MySQL/MariaDB: each strategy's own (`lease::admin`, `row_lock::admin`).

use lock_core::{Forced, HeldLock, LockAdmin, LockError, LockName, backend::async_trait};

use crate::{MySqlBackend, backend::Imp};

#[async_trait]
impl LockAdmin for MySqlBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        self.on_server(async {
            match self.imp() {
                Imp::Lease(s) => s.list(prefix).await,
                Imp::RowLock(s) => s.list(prefix).await,
            }
        })
        .await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        self.on_server(async {
            match self.imp() {
                Imp::Lease(s) => s.force_release(name).await,
                Imp::RowLock(s) => s.force_release(name).await,
            }
        })
        .await
    }
}
