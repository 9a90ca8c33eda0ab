#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod encoding;
mod error;
mod metrics;
mod node;
mod recipe;
mod session;

pub use backend::ZkBackend;
pub use config::{ZkAuth, ZkConfig};
pub use metrics::OpCounts;

#[cfg(test)]
mod bounds {
    //! Compile-time checks that the backend and its futures can move across tasks.
    use super::*;

    fn is_send_sync_static<T: Send + Sync + 'static>() {}

    #[test]
    fn backend_and_futures_are_send() {
        is_send_sync_static::<ZkBackend>();
        is_send_sync_static::<ZkConfig>();
        fn future_is_send<F: std::future::Future + Send>(_: F) {}
        future_is_send(ZkBackend::connect(ZkConfig::default()));
    }
}
