//! Malformed and hostile store URLs: each is a typed [`LockError::InvalidOptions`] that names
//! what is wrong, never a panic, and no message, `Debug` or `Display` shows the password.

use distributed_lock::{LockError, StoreConfig};

/// `(url, a word the error must contain)`; every password in them is `hunter2`.
const CASES: &[(&str, &str)] = &[
    ("", "scheme"),
    ("redis", "scheme"),
    ("redis:/127.0.0.1:6379", "scheme"),
    ("://127.0.0.1:6379", "scheme"),
    ("ftp://127.0.0.1:21", "no store this library knows"),
    ("redis://", "no host"),
    ("redis://:hunter2@", "no host"),
    ("redis://127.0.0.1:0", "port"),
    ("redis://127.0.0.1:65536", "port"),
    ("redis://127.0.0.1:99999999999999999999", "port"),
    ("redis://127.0.0.1:-1", "port"),
    ("redis://127.0.0.1:http", "port"),
    (
        "redis://:hunter2@127.0.0.1:6379,127.0.0.1:6380",
        "one server",
    ),
    ("redis://127.0.0.1:6379/db0", "database"),
    ("redis://127.0.0.1:6379?prefx=app", "`prefx`"),
    ("redis://127.0.0.1:6379?prefix=a}b", "key prefix"),
    ("redis://127.0.0.1:6379?prefix=a&prefix=b", "given twice"),
    (
        "redis://127.0.0.1:6379?response_timeout_ms=0",
        "response_timeout",
    ),
    (
        "redis://127.0.0.1:6379?response_timeout_ms=1e3",
        "response_timeout_ms",
    ),
    (
        "redis://127.0.0.1:6379?replica_acks=18446744073709551616",
        "replica_acks",
    ),
    ("redis://127.0.0.1:6379?hand_over=no", "hand_over"),
    (
        "rediss+cluster://:hunter2@127.0.0.1:7000,127.0.0.1:7001",
        "TLS",
    ),
    (
        "redis://:hunter2@127.0.0.1:6379?ca_file=/etc/ca.pem",
        "ca_file",
    ),
    ("redis+cluster://127.0.0.1:7000/2", "database 0"),
    (
        "redis+cluster://127.0.0.1:7000,,127.0.0.1:7001",
        "no host name",
    ),
    ("redlock://:hunter2@a:1,b:1,c:1?quorum=1", "`quorum`"),
    (
        "migrate://?from=redis://:hunter2%40h:1&to=zk://h:2&record=memory://r&phase=both",
        "phase",
    ),
    (
        "migrate://?from=redis://:hunter2@h:1&to=zk://h:2&record=memory://r&phase=dual",
        "percent-encoded",
    ),
    (
        "migrate://h:1?from=redis://:hunter2%40h:1&to=zk://h:2&record=memory://r&phase=dual",
        "no host",
    ),
    (
        "migrate://?from=redis://:hunter2%40h:1&to=zk://h:2&phase=dual",
        "`record`",
    ),
    (
        "migrate://?from=redis://:hunter2%40h:0&to=zk://h:2&record=memory://r&phase=dual",
        "port",
    ),
    (
        "migrate://?from=migrate://%3Ffrom%3Dmemory://a&to=zk://h:2&record=memory://r&phase=dual",
        "`from`",
    ),
    ("redlock://a:1,b:1,c:1?node_timeout_ms=0", "node_timeout"),
    ("mysql://lock:hunter2@127.0.0.1:13306", "no database"),
    (
        "mysql://lock:hunter2@127.0.0.1:13306/db?table=x;DROP%20TABLE%20y",
        "table",
    ),
    ("mysql://lock:hunter2@127.0.0.1:13306/db?table=`x`", "table"),
    (
        "mysql://lock:hunter2@127.0.0.1:13306/db?strategy=queue",
        "strategy",
    ),
    (
        "mysql://lock:hunter2@127.0.0.1:13306/db?pool_size=0",
        "pool_size",
    ),
    (
        "mysql://lock:hunter2@127.0.0.1:13306/db?pool_size=4294967296",
        "pool_size",
    ),
    (
        "mysql://lock:hunter2@127.0.0.1:13306/db?sslmod=required",
        "no parameter `sslmod`",
    ),
    (
        "mysql://lock:hunter2@127.0.0.1:13306/db?timezone=%2B01:00",
        "UTC",
    ),
    ("mysql://lock:hunter2@h1:1,h2:1/db", "several hosts"),
    ("mysql://lock:hunter%ff@127.0.0.1:13306/db", "UTF-8"),
    ("mysql://lock:hunter2@127.0.0.1:13306/db%", "hex digits"),
    (
        "zk://:hunter2@127.0.0.1:2181/locks?session_timeout_ms=abc",
        "session_timeout_ms",
    ),
    (
        "zk://127.0.0.1:2181/locks?session_timeout_ms=99999999999",
        "session timeout",
    ),
    ("zk://127.0.0.1:2181/", "lock root"),
    ("zk://127.0.0.1:2181/a//b", "lock root"),
    ("zk://127.0.0.1:2181/a/%00", "control character"),
    ("zk://127.0.0.1:2181/locks?failover=maybe", "failover"),
    ("zookeeper://127.0.0.1:2181?chroot=/x", "`chroot`"),
    ("memory://a,b", "one instance name"),
    ("memory://x/path", "one instance name"),
    ("memory://x?ttl=5", "`ttl`"),
    ("memory://?require=quorom", "\"quorom\""),
    ("memory://?require=fifo&require=push", "given twice"),
    ("redis://127.0.0.1:6379\r\nSET x 1", "U+000D"),
    ("redis://127.0.0.1:6379 ", "U+0020"),
    ("redis://[::1:6379", "`[`"),
    ("redis://127.0.0.1:6379#fragment", "fragment"),
    ("redis://u:hun?ter2@127.0.0.1:6379", "percent-encoded"),
    ("redis://:hun/ter2@127.0.0.1:6379", "percent-encoded"),
    (
        "mysql://lock:hun?ter2@127.0.0.1:13306/db",
        "percent-encoded",
    ),
    ("zk://app:hun/ter2@127.0.0.1:2181/locks", "percent-encoded"),
    ("redis://:hun:ter2@127.0.0.1:port", "port"),
];

#[test]
fn every_hostile_url_is_a_typed_error_that_hides_the_password() {
    assert!(CASES.len() >= 30);
    for (url, word) in CASES {
        let error = match url.parse::<StoreConfig>() {
            Ok(config) => panic!("{url:?} parsed: {config:?}"),
            Err(error) => error,
        };
        assert!(
            matches!(error, LockError::InvalidOptions { .. }),
            "{url:?}: {error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(word),
            "{url:?}: {text:?} does not say {word:?}"
        );
        assert!(!text.contains("hunter2"), "{url:?}: {text}");
        assert!(
            !format!("{error:?}").contains("hunter2"),
            "{url:?}: {error:?}"
        );
    }
}

#[test]
fn huge_urls_are_refused_before_they_are_read() {
    let huge = format!("redis://127.0.0.1:6379?prefix={}", "a".repeat(1 << 20));
    let error = huge.parse::<StoreConfig>().unwrap_err();
    assert!(error.to_string().contains("at most 8192"), "{error}");
    let many = format!("zk://{}", vec!["h:1"; 5000].join(","));
    assert!(many.parse::<StoreConfig>().is_err());
}

#[test]
fn parsed_configs_never_show_the_password() {
    for url in [
        "redis://:hunter2@127.0.0.1:6379",
        "redis+cluster://user:hunter2@a:1,b:1",
        "redlock://:hunter2@a:1,b:1,c:1",
        "mysql://lock:hunter2@127.0.0.1:13306/db?strategy=row-lock",
        "zk://app:hunter2@a:1,b:1/locks?require=quorum",
    ] {
        let config: StoreConfig = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
        for shown in [format!("{config:?}"), config.to_string()] {
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
        }
    }
}
