#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod lease_queue;
mod lease_strategy;
mod local_queue;
mod lock_row;
mod row_lock;
mod schema;
mod script;
mod server;
mod table_name;

pub use backend::MySqlBackend;
pub use config::{MySqlConfig, Strategy};
pub use schema::{SCHEMA_VERSION, create_table_sql};
pub use table_name::TableName;
