#![doc = include_str!("../README.md")]

mod admin;
mod anchor;
mod backend;
mod config;
mod error;
mod kept;
mod lease;
mod local_queue;
mod row_lock;
mod rows;
mod schema;
mod server;
mod sql;
mod table_name;

pub use backend::MySqlBackend;
pub use config::{MySqlConfig, SQLX_PARAMETERS, Strategy};
pub use schema::{SCHEMA_VERSION, create_table_sql};
pub use table_name::TableName;

/// How long a lease handed to the first waiter of the lease strategy waits for it to come
/// (its turn), for a waiter using `backoff`: the longest it may be asleep (its back-off
/// maximum, or a park of at most a second) plus 100 ms. A waiter that died or is paused
/// holds up a released lease that long (see the crate docs, "Bounded stalls").
///
/// ```
/// use std::time::Duration;
/// assert_eq!(
///     lock_mysql::lease_waiter_turn(&lock_core::Backoff::default()),
///     Duration::from_millis(1_100)
/// );
/// ```
pub fn lease_waiter_turn(backoff: &lock_core::Backoff) -> std::time::Duration {
    lease::queue::turn_for(backoff.max)
}

#[cfg(test)]
mod bounds {
    //! The backend, its config and its futures can move across tasks.
    use conformance_tests::bounds::{send, send_sync_static};

    use super::*;

    #[test]
    fn backends_and_futures_are_send() {
        send_sync_static::<MySqlBackend>();
        send_sync_static::<MySqlConfig>();
        send(&MySqlBackend::connect(&MySqlConfig::new(
            "mysql://u@127.0.0.1:1/db",
        )));
    }
}
