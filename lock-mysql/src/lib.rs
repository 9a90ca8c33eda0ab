#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod lease;
mod local_queue;
mod row_lock;
mod rows;
mod schema;
mod server;
mod sql;
mod table_name;

pub use backend::MySqlBackend;
pub use config::{MySqlConfig, Strategy};
pub use schema::{SCHEMA_VERSION, create_table_sql};
pub use table_name::TableName;

#[cfg(test)]
mod bounds {
    //! Compile-time checks that the backends, their configs and futures can move across
    //! tasks.
    use super::*;

    fn is_send_sync_static<T: Send + Sync + 'static>() {}
    fn is_send<F: std::future::Future + Send>(_: &F) {}

    #[test]
    fn backends_and_futures_are_send() {
        is_send_sync_static::<MySqlBackend>();
        is_send_sync_static::<MySqlConfig>();
        let config = MySqlConfig::new("mysql://u@127.0.0.1:1/db");
        // Not awaited: only the types are checked.
        is_send(&MySqlBackend::connect(&config));
    }
}
