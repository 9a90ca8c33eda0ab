#![doc = include_str!("../README.md")]

mod admin;
pub mod backend;
mod capabilities;
mod client;
mod end_signal;
mod error;
mod fence;
mod guard;
mod hold;
mod holder;
pub mod layer;
mod lease;
mod memory;
pub mod migrate;
mod multi;
mod name;
mod options;
mod redact;
mod reentry;
mod request;
mod store_url;
mod waiting;
mod watchdog;

pub use admin::{Forced, HeldLock, LockAdmin};
pub use backend::LockBackend;
pub use capabilities::{Capabilities, Clock, Expiry, Failover, Fencing, WaitOrder, Wakeup};
pub use client::LockClient;
pub use error::{LockError, LossReason};
pub use fence::Fence;
pub use guard::{LockGuard, Lost};
pub use holder::{Holder, HolderId};
pub use lease::{Lease, LockInfo};
pub use memory::MemoryBackend;
pub use multi::MultiGuard;
pub use name::{IntoLockName, LockName};
pub use options::{Backoff, LockOptions, MAX_TTL, MAX_WAIT, MIN_RENEW_EVERY, MIN_TTL};

#[cfg(test)]
mod bounds {
    //! Compile-time checks that clients, guards and their futures can move across tasks.
    use super::*;

    fn is_send_sync_static<T: Send + Sync + 'static>() {}
    fn is_send_static<T: Send + 'static>(_: &T) {}
    fn is_send<T: Send>(_: &T) {}

    #[test]
    fn guards_and_futures_are_send_and_static() {
        is_send_sync_static::<LockClient>();
        is_send_sync_static::<LockGuard>();
        is_send_sync_static::<Holder>();
        is_send_sync_static::<LockError>();
        is_send_sync_static::<std::sync::Arc<dyn LockBackend>>();
        let client = LockClient::new(MemoryBackend::new());
        let holder = Holder::new();
        let options = LockOptions::new();
        // Not awaited: only the types are checked.
        let lock = client.lock("bounds");
        is_send(&lock);
        drop(lock);
        let acquire = client.acquire(&holder, "bounds", &options);
        is_send(&acquire);
        drop(acquire);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let guard = runtime.block_on(client.lock("bounds")).unwrap();
        let lost = guard.lost();
        is_send_static(&lost);
        let extend = guard.extend(std::time::Duration::from_secs(5));
        is_send(&extend);
        drop(extend);
        let release = guard.release();
        is_send_static(&release);
        runtime.block_on(release).unwrap();
    }
}
