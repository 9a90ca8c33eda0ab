//! What this crate's server tests share.

/// `host:port,host:port` of a comma-separated list of `redis://host:port` URLs (as
/// `cargo xtask services env` prints them), for a `redis+cluster://` or `redlock://` URL.
pub(crate) fn hosts(list: &str) -> String {
    list.split(',')
        .map(|u| u.trim_start_matches("redis://"))
        .collect::<Vec<_>>()
        .join(",")
}
