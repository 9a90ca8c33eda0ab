//! Lock names as ZooKeeper path segments: a lossless, injective percent-encoding.
//!
//! A [`LockName`] is 1 to 200 bytes of UTF-8 without control characters; a ZooKeeper path
//! segment may not contain `/`, may not be `.` or `..`, and ZooKeeper rejects some Unicode
//! ranges. Every byte outside the URI "unreserved" set (`A-Z a-z 0-9 - . _ ~`) is written as
//! `%XX` (uppercase hex), `%` included, so the segment is plain ASCII, decoding is unique, and
//! two different names never share a segment. The segments `.` and `..` have their dots
//! encoded too.

use lock_core::{LockName, backend::percent_decode};

/// Whether `byte` is written as itself.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escaped(out: &mut String, byte: u8) {
    out.push('%');
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0x0f)]));
}

/// The path segment of `name`.
pub(crate) fn encode_name(name: &LockName) -> String {
    let text = name.as_str();
    if text == "." || text == ".." {
        return "%2E".repeat(text.len());
    }
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if is_unreserved(byte) {
            out.push(char::from(byte));
        } else {
            push_escaped(&mut out, byte);
        }
    }
    out
}

/// The lock name a segment written by [`encode_name`] stands for; `None` for a segment this
/// encoding never produces (the listing of an operator's view reads names back with it).
pub(crate) fn decode_segment(segment: &str) -> Option<LockName> {
    let bytes = percent_decode(segment)?;
    let name = LockName::from_bytes(&bytes).ok()?;
    // Only the canonical form is ours: `%61` and `a` decode alike, but only `a` is written.
    (encode_name(&name) == segment).then_some(name)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn name(text: &str) -> LockName {
        LockName::new(text).unwrap()
    }

    #[test]
    fn readable_names_stay_readable() {
        assert_eq!(encode_name(&name("jobs.daily-1_x~")), "jobs.daily-1_x~");
        assert_eq!(encode_name(&name("billing/run 1")), "billing%2Frun%201");
        assert_eq!(encode_name(&name("100%")), "100%25");
        assert_eq!(encode_name(&name("ü")), "%C3%BC");
    }

    #[test]
    fn dot_segments_are_escaped() {
        assert_eq!(encode_name(&name(".")), "%2E");
        assert_eq!(encode_name(&name("..")), "%2E%2E");
        assert_eq!(encode_name(&name("...")), "...");
        assert_eq!(decode_segment("%2E").unwrap().as_str(), ".");
        assert_eq!(decode_segment("%2E%2E").unwrap().as_str(), "..");
    }

    #[test]
    fn segments_are_valid_zookeeper_segments() {
        for text in [
            "a/b", "/", "a\\b", "{a}", "🔒", "_c_", "-lock-", "%%", "\u{e000}", "\u{fff0}",
        ] {
            let segment = encode_name(&name(text));
            assert!(!segment.contains('/'), "{segment}");
            assert!(segment.is_ascii(), "{segment}");
            assert!(segment != "." && segment != "..");
            assert!(!segment.is_empty());
        }
    }

    #[test]
    fn encoding_is_lossless_and_injective() {
        let texts = [
            "a", "A", "a/b", "a%2Fb", "a%2fb", "a_b", "a:b", "a.b", "a..b", "{a}", "{a}b", "a b",
            "a\\b", "a*", "a?", "ü", "u\u{308}", "🔒", "_c_", "-lock-", "%", "%%", ".", "..",
            "%2E", "%2E%2E", "~", "%7E",
        ];
        let mut seen = HashSet::new();
        for text in texts {
            let n = name(text);
            let segment = encode_name(&n);
            assert!(
                seen.insert(segment.clone()),
                "{text:?} collides as {segment}"
            );
            assert_eq!(decode_segment(&segment), Some(n), "{segment}");
        }
        let longest = name(&"🔒".repeat(50));
        assert_eq!(encode_name(&longest).len(), 600);
        assert_eq!(decode_segment(&encode_name(&longest)), Some(longest));
    }

    #[test]
    fn foreign_segments_do_not_decode() {
        assert_eq!(decode_segment("%61"), None, "non-canonical escape");
        assert_eq!(decode_segment("a b"), None, "unescaped space");
        assert_eq!(decode_segment("%"), None);
        assert_eq!(decode_segment("%G1"), None);
        assert_eq!(decode_segment("%FF"), None, "not UTF-8");
        assert_eq!(decode_segment(""), None);
    }
}
