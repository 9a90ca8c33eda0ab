#![doc = include_str!("../README.md")]

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
mod name;
mod options;
mod reentry;
mod request;
mod waiting;
mod watchdog;

pub use backend::LockBackend;
pub use capabilities::{Capabilities, Clock, Expiry, Failover, Fencing, WaitOrder, Wakeup};
pub use client::LockClient;
pub use error::{LockError, LossReason};
pub use fence::Fence;
pub use guard::{LockGuard, Lost};
pub use holder::{Holder, HolderId};
pub use lease::{Lease, LockInfo};
pub use memory::MemoryBackend;
pub use name::{IntoLockName, LockName};
pub use options::{Backoff, LockOptions, MAX_TTL, MAX_WAIT, MIN_RENEW_EVERY, MIN_TTL};

#[cfg(test)]
mod bounds {
    //! Compile-time checks that guards and futures can move across tasks.
    use super::*;

    fn is_send_static<T: Send + 'static>(_: &T) {}
    fn is_send_sync_static<T: Send + Sync + 'static>() {}

    #[test]
    fn guards_and_futures_are_send_and_static() {
        is_send_sync_static::<LockClient>();
        is_send_sync_static::<Holder>();
        is_send_sync_static::<LockError>();
        is_send_static::<Option<LockGuard>>(&None);
        let client = LockClient::new(MemoryBackend::new());
        let holder = Holder::new();
        let name = LockName::new("bounds").unwrap();
        let options = LockOptions::new();
        // Not awaited: only the types are checked.
        let future = client.acquire(&holder, &name, &options);
        is_send_static_ref(&future);
        drop(future);
    }

    fn is_send_static_ref<T: Send>(_: &T) {}
}
