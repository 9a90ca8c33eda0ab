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
