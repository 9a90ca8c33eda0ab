#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod connection;
mod error;
mod keys;
mod ops;
mod redlock;
mod scripts;
mod waiters;

pub use backend::RedisBackend;
pub use config::{RedisConfig, RedlockConfig};
pub use keys::RedisKeys;
pub use redlock::RedlockBackend;

#[cfg(test)]
mod bounds {
    //! Compile-time checks that the backends, their configs and futures can move across
    //! tasks.
    use super::*;

    fn is_send_sync_static<T: Send + Sync + 'static>() {}
    fn is_send<F: std::future::Future + Send>(_: &F) {}

    #[test]
    fn backends_and_futures_are_send() {
        is_send_sync_static::<RedisBackend>();
        is_send_sync_static::<RedlockBackend>();
        is_send_sync_static::<RedisConfig>();
        is_send_sync_static::<RedlockConfig>();
        // Not awaited: only the types are checked.
        is_send(&RedisBackend::connect(RedisConfig::single(
            "redis://127.0.0.1:1",
        )));
        is_send(&RedlockBackend::connect(RedlockConfig::new([
            "redis://127.0.0.1:1",
        ])));
    }
}
