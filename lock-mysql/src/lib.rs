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
