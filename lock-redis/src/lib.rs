#![doc = include_str!("../README.md")]

mod admin;
mod backend;
mod cluster_renewals;
mod config;
mod connection;
mod error;
mod eval;
mod keys;
mod migration_record;
mod ops;
mod redlock;
mod scripts;
mod subscriber;
mod waiters;

pub use backend::RedisBackend;
pub use config::{RedisConfig, RedlockConfig};
pub use keys::RedisKeys;
pub use migration_record::RedisRecord;
pub use redlock::RedlockBackend;

#[cfg(test)]
mod bounds {
    //! The backends, their configs and their futures can move across tasks.
    use conformance_tests::bounds::{send, send_sync_static};

    use super::*;

    #[test]
    fn backends_and_futures_are_send() {
        send_sync_static::<RedisBackend>();
        send_sync_static::<RedlockBackend>();
        send_sync_static::<RedisConfig>();
        send_sync_static::<RedlockConfig>();
        send(&RedisBackend::connect(RedisConfig::single(
            "redis://127.0.0.1:1",
        )));
        send(&RedlockBackend::connect(RedlockConfig::new([
            "redis://127.0.0.1:1",
        ])));
    }
}
