#![doc = include_str!("../README.md")]

mod admin;
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
    //! The backend, its config and its futures can move across tasks.
    use conformance_tests::bounds::{send, send_sync_static};

    use super::*;

    #[test]
    fn backend_and_futures_are_send() {
        send_sync_static::<ZkBackend>();
        send_sync_static::<ZkConfig>();
        send(&ZkBackend::connect(ZkConfig::default()));
    }
}
