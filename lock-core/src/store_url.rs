//! [`StoreUrl`]: the one parser of store URLs, which every backend's `from_url` reads its
//! settings from, so that every store's URL follows the same rules.
//!
//! The shape is `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?key=value&...]`.
//! Several hosts are split here by hand (the `url` crate refuses them). The rules:
//!
//! - user, password, path and query values are percent-decoded and must be UTF-8;
//! - every host is a name or an address (`[v6]` in brackets) with an optional port from 1 to
//!   65535, with no spaces or control characters;
//! - a query key given twice is an error, and so is a key the store does not know:
//!   [`StoreUrl::finish`] names it (a misspelt safety setting must not be ignored);
//! - a URL longer than [`MAX_URL_LEN`] is refused before anything else is read;
//! - no error message carries the password, nor quotes a host (a password with a raw `/` or
//!   `?` would end up there); a `@` after the host part is refused without quoting it.

use std::{str::FromStr, time::Duration};

use crate::LockError;

/// The longest store URL accepted, in bytes.
pub const MAX_URL_LEN: usize = 8 * 1024;

/// A store URL split into its parts, its query keys taken one by one.
///
/// ```
/// use std::time::Duration;
/// use lock_core::backend::StoreUrl;
///
/// let mut url = StoreUrl::parse("redlock://:s3cret@10.0.0.1:6379,10.0.0.2:6379?prefix=app&node_timeout_ms=50")?;
/// assert_eq!(url.scheme(), "redlock");
/// assert_eq!(url.hosts(), ["10.0.0.1:6379", "10.0.0.2:6379"]);
/// assert_eq!(url.password(), Some("s3cret"));
/// assert_eq!(url.take("prefix")?.as_deref(), Some("app"));
/// assert_eq!(url.take_millis("node_timeout_ms")?, Some(Duration::from_millis(50)));
/// url.finish()?;
///
/// let mut url = StoreUrl::parse("redis://127.0.0.1:6379?prefx=app")?;
/// let error = url.finish().unwrap_err();
/// assert!(error.to_string().contains("`prefx`"), "{error}");
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    scheme: String,
    user: Option<String>,
    password: Option<String>,
    /// The raw `user[:password]` part, as written (for a URL handed on to a client library).
    userinfo: Option<String>,
    hosts: Vec<String>,
    path: String,
    query: Vec<(String, String)>,
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreUrl")
            .field("scheme", &self.scheme)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("query", &self.query)
            .finish()
    }
}

fn invalid(reason: impl Into<String>) -> LockError {
    LockError::invalid_options(reason.into())
}

/// Percent-decodes `text` into bytes; `None` when a `%` is not followed by two hex digits.
///
/// ```
/// use lock_core::backend::percent_decode;
///
/// assert_eq!(percent_decode("a%2Fb").as_deref(), Some(&b"a/b"[..]));
/// assert_eq!(percent_decode("a%2"), None);
/// ```
pub fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |at: usize| {
                bytes
                    .get(at)
                    .and_then(|b| char::from(*b).to_digit(16))
                    .and_then(|d| u8::try_from(d).ok())
            };
            out.push(hex(i + 1)? << 4 | hex(i + 2)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Percent-decodes `text` into UTF-8; `what` names the part for the error.
fn decode(text: &str, what: &str) -> Result<String, LockError> {
    let bytes = percent_decode(text).ok_or_else(|| {
        invalid(format!(
            "store URL: the {what} has a `%` not followed by two hex digits"
        ))
    })?;
    String::from_utf8(bytes).map_err(|_| {
        invalid(format!(
            "store URL: the {what} is not UTF-8 once percent-decoded"
        ))
    })
}

/// Checks one `host[:port]` entry, the `number`th. Its text is never quoted: when a password
/// holds a raw `/`, `?` or `#`, part of it ends up here.
fn check_host(number: usize, entry: &str) -> Result<(), LockError> {
    let bad = |why: &str| {
        Err(invalid(format!(
            "store URL: host number {number} {why}; expected `host:port` (or `[v6 address]:port`)"
        )))
    };
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let Some((address, after)) = rest.split_once(']') else {
            return bad("opens `[` without closing it");
        };
        if address.is_empty() || !address.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return bad("is not an IPv6 address in brackets");
        }
        match after.strip_prefix(':') {
            Some(port) => (address, Some(port)),
            None if after.is_empty() => (address, None),
            None => return bad("has text after its `]`"),
        }
    } else {
        match entry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    if host.is_empty() {
        return bad("has no host name");
    }
    if !entry.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return bad("has characters a host name cannot have");
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return bad("has a port that is not a number from 1 to 65535"),
        }
    }
    Ok(())
}

impl StoreUrl {
    /// Splits `url` into its parts.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] saying what is wrong (never showing the password): no
    /// `scheme://`, no host, a bad host or port, bad percent-encoding, a key given twice, a
    /// URL over [`MAX_URL_LEN`].
    pub fn parse(url: &str) -> Result<Self, LockError> {
        if url.len() > MAX_URL_LEN {
            return Err(invalid(format!(
                "store URL: {} bytes long; at most {MAX_URL_LEN} are accepted",
                url.len()
            )));
        }
        if let Some(c) = url.chars().find(|c| c.is_control() || c.is_whitespace()) {
            return Err(invalid(format!(
                "store URL: contains the character U+{:04X} (spaces and control characters \
                 must be percent-encoded)",
                u32::from(c)
            )));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid(
                "store URL: no `scheme://`; expected for example `redis://host:port`",
            ));
        };
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            return Err(invalid(format!("store URL: {scheme:?} is not a scheme")));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        if rest.contains('#') || query.contains('#') {
            return Err(invalid("store URL: a `#fragment` means nothing to a store"));
        }
        let (authority, path) = rest.find('/').map_or((rest, ""), |at| rest.split_at(at));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        if userinfo.is_none() && (path.contains('@') || query.contains('@')) {
            // Most likely a password with a raw `/` or `?` that cut the credentials short:
            // said without quoting any of it.
            return Err(invalid(
                "store URL: a `@` after the host part; a password (or any value) with `/`, `?`, \
                 `#` or `@` in it must be percent-encoded (`%2F`, `%3F`, `%23`, `%40`)",
            ));
        }
        let (user, password) = match userinfo {
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (info, None),
                };
                let user = Some(decode(user, "user name")?).filter(|u| !u.is_empty());
                let password = password.map(|p| decode(p, "password")).transpose()?;
                (user, password)
            }
            None => (None, None),
        };
        let hosts: Vec<String> = if hosts.is_empty() {
            Vec::new()
        } else {
            hosts.split(',').map(str::to_owned).collect()
        };
        for (i, host) in hosts.iter().enumerate() {
            check_host(i + 1, host)?;
        }
        let mut pairs: Vec<(String, String)> = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(key, "query")?;
            let value = decode(&value.replace('+', " "), &format!("value of `{key}`"))?;
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(invalid(format!("store URL: `{key}` is given twice")));
            }
            pairs.push((key, value));
        }
        Ok(Self {
            scheme: scheme.to_ascii_lowercase(),
            user,
            password,
            userinfo: userinfo.map(str::to_owned),
            hosts,
            path: decode(path, "path")?,
            query: pairs,
        })
    }

    /// The scheme, lower-case (`redis`, `redis+cluster`, `zk`, ...).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name, percent-decoded (`None` when empty or absent).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password, percent-decoded.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `user[:password]@` as written, or nothing: for a URL handed on to a client library.
    pub fn userinfo_prefix(&self) -> String {
        self.userinfo
            .as_ref()
            .map_or_else(String::new, |info| format!("{info}@"))
    }

    /// The hosts, each `host[:port]` as written (checked).
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The hosts, or an error saying the URL names none.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] when there is no host.
    pub fn require_hosts(&self) -> Result<&[String], LockError> {
        if self.hosts.is_empty() {
            return Err(invalid(format!(
                "store URL: `{}://` names no host",
                self.scheme
            )));
        }
        Ok(&self.hosts)
    }

    /// The path, percent-decoded (empty, or starting with `/`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Takes the query value of `key` (later, [`StoreUrl::finish`] refuses keys not taken).
    ///
    /// # Errors
    /// None today; a `Result` so that callers treat every key alike.
    pub fn take(&mut self, key: &str) -> Result<Option<String>, LockError> {
        Ok(self
            .query
            .iter()
            .position(|(k, _)| k == key)
            .map(|at| self.query.remove(at).1))
    }

    /// Takes `key` and parses its value.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the key when its value does not parse.
    pub fn take_parsed<T: FromStr>(&mut self, key: &str) -> Result<Option<T>, LockError> {
        self.take(key)?
            .map(|value| {
                value.parse().map_err(|_| {
                    invalid(format!(
                        "store URL: `{key}={value}` is not a valid {}",
                        std::any::type_name::<T>()
                            .rsplit("::")
                            .next()
                            .unwrap_or("value")
                    ))
                })
            })
            .transpose()
    }

    /// Takes `key` as a number of milliseconds.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the key when it is not a whole number.
    pub fn take_millis(&mut self, key: &str) -> Result<Option<Duration>, LockError> {
        Ok(self.take_parsed::<u64>(key)?.map(Duration::from_millis))
    }

    /// The query pairs not taken yet, in order (for a store that hands them on).
    pub fn rest(&self) -> &[(String, String)] {
        &self.query
    }

    /// Checks that every query key was taken.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the first key nobody took.
    pub fn finish(self) -> Result<(), LockError> {
        match self.query.first() {
            None => Ok(()),
            Some((key, _)) => Err(invalid(format!(
                "store URL: `{}://` has no setting `{key}`",
                self.scheme
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_urls_are_typed_errors_without_the_password() {
        let long = format!("redis://h:1?prefix={}", "a".repeat(MAX_URL_LEN));
        for url in [
            "",
            "redis:/h:1",
            "://h:1",
            "re dis://h:1",
            "redis://h:0",
            "redis://h:65536",
            "redis://h:-1",
            "redis://h:port",
            "redis://:secret@h:1,,h:2",
            "redis://:secret@[::1",
            "redis://[zz]:1",
            "redis://h\u{0}:1",
            "redis://h:1/%zz",
            "redis://h:1?prefix=%ff",
            "redis://:pw%ff@h:1",
            "redis://h:1?a=1&a=2",
            "redis://h:1#frag",
            "redis://h:1:2",
            "redis://h;rm:1",
            "redis://u:hun?ter2@h:1",
            "redis://:hun/ter2@h:1",
            "redis://:hun#ter2@h:1",
            "redis://:hun/ter2@h:1?prefix=x",
            long.as_str(),
        ] {
            let error = StoreUrl::parse(url).unwrap_err();
            assert!(
                matches!(error, LockError::InvalidOptions { .. }),
                "{url}: {error:?}"
            );
            for piece in ["secret", "hun", "ter2"] {
                assert!(!error.to_string().contains(piece), "{url}: {error}");
            }
        }
    }

    #[test]
    fn parts_are_decoded() {
        let mut url =
            StoreUrl::parse("zk://app%40x:p%3Aw@[::1]:2181,h2/app/locks?session_timeout_ms=4000")
                .unwrap();
        assert_eq!(url.user(), Some("app@x"));
        assert_eq!(url.password(), Some("p:w"));
        assert_eq!(url.userinfo_prefix(), "app%40x:p%3Aw@");
        assert_eq!(url.hosts(), ["[::1]:2181", "h2"]);
        assert_eq!(url.path(), "/app/locks");
        assert_eq!(
            url.take_millis("session_timeout_ms").unwrap(),
            Some(Duration::from_secs(4))
        );
        assert!(url.take("missing").unwrap().is_none());
        url.finish().unwrap();
        assert!(!format!("{:?}", StoreUrl::parse("redis://:pw@h").unwrap()).contains("pw"));
    }

    #[test]
    fn values_that_do_not_parse_name_their_key() {
        let mut url = StoreUrl::parse("redis://h?pool=99999999999999999999999").unwrap();
        let error = url.take_parsed::<u32>("pool").unwrap_err();
        assert!(error.to_string().contains("`pool="), "{error}");
    }
}
