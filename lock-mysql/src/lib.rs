#![doc = include_str!("../README.md")]

mod admin;
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
pub use config::{MySqlConfig, SQLX_PARAMETERS, Strategy};
pub use schema::{SCHEMA_VERSION, create_table_sql};
pub use table_name::TableName;

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
