//! [`redact_url`]: one way for every store to show a URL without its password.

/// `url` with the password of its user info replaced by `***`, for `Debug`, `Display` and
/// error messages. Only the authority (between `://` and the first `/`, `?` or `#`) is
/// looked at, so an `@` in a path or query is left alone; a user without a password is shown
/// as it is. Text without `://` that holds an `@` is shown as `***@` and what follows the
/// last `@`.
///
/// ```
/// use lock_core::backend::redact_url;
///
/// assert_eq!(redact_url("redis://app:s3cret@h:6379/0"), "redis://app:***@h:6379/0");
/// assert_eq!(redact_url("mysql://:s3cret@h/db?x=a@b"), "mysql://:***@h/db?x=a@b");
/// assert_eq!(redact_url("zk://app@h1:2181,h2:2181/locks"), "zk://app@h1:2181,h2:2181/locks");
/// assert_eq!(redact_url("app:s3cret@h"), "***@h");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return match url.rfind('@') {
            Some(at) => format!("***{}", &url[at..]),
            None => url.to_owned(),
        };
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..scheme_end],
        &userinfo[..colon],
        &rest[at..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_nothing_else_changes() {
        assert_eq!(redact_url("redis://u:p4ss@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://:p4ss@h:1"), "redis://:***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("redis://u@h:1"), "redis://u@h:1");
        assert_eq!(
            redact_url("mysql://u:p:a@ss@h/db"),
            "mysql://u:***@h/db",
            "a password may hold ':' and '@'"
        );
        assert_eq!(redact_url("redis://h/0?user=a@b"), "redis://h/0?user=a@b");
        assert_eq!(redact_url("u:p@h"), "***@h");
        assert_eq!(redact_url(""), "");
    }
}
