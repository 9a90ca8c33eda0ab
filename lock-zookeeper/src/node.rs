//! Contender node names in Curator's protected layout, `_c_<uuid>-lock-<sequence>`.
//!
//! Curator's `InterProcessMutex` creates its contender nodes with `withProtection()` and the
//! lock name `lock-`: `_c_` + a 36-character UUID + `-` + `lock-` + the 10-digit sequence
//! ZooKeeper appends to EPHEMERAL_SEQUENTIAL nodes. Writing the same layout on the same path
//! makes Curator clients and ours one queue. ZooKeeper may one day use 19-digit (64-bit)
//! sequences; both widths are accepted and sequences compare as numbers.

/// Curator's protection prefix.
const PROTECTED: &str = "_c_";
/// Curator `InterProcessMutex`'s lock name.
const LOCK_NAME: &str = "lock-";
/// The length of a textual UUID.
const UUID_LEN: usize = 36;

/// The name prefix of a node created with `uuid`, up to the sequence ZooKeeper appends.
pub(crate) fn prefix(uuid: &uuid::Uuid) -> String {
    format!("{PROTECTED}{}-{LOCK_NAME}", uuid.hyphenated())
}

/// The prefix by which the node of `uuid` is found again after a lost reply
/// (`_c_<uuid>-`, as Curator's protected mode searches for it).
pub(crate) fn uuid_prefix(uuid: &uuid::Uuid) -> String {
    format!("{PROTECTED}{}-", uuid.hyphenated())
}

/// A child of a lock path that is a contender in the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Contender<'a> {
    /// The node's name (one path segment).
    pub(crate) name: &'a str,
    /// The sequence ZooKeeper appended.
    pub(crate) sequence: u64,
}

fn is_uuid_text(text: &str) -> bool {
    text.len() == UUID_LEN
        && text.bytes().enumerate().all(|(i, b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        })
}

/// Parses a child name; `None` when it is not in the layout.
pub(crate) fn parse(name: &str) -> Option<Contender<'_>> {
    let rest = name.strip_prefix(PROTECTED)?;
    let uuid = rest.get(..UUID_LEN)?;
    if !is_uuid_text(uuid) {
        return None;
    }
    let digits = rest
        .get(UUID_LEN..)?
        .strip_prefix('-')?
        .strip_prefix(LOCK_NAME)?;
    if !(10..=19).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let sequence = digits.parse().ok()?;
    Some(Contender { name, sequence })
}

/// The children of a lock path, sorted by sequence, or the names that are not contenders.
pub(crate) fn contenders(children: &[String]) -> Result<Vec<Contender<'_>>, Vec<&str>> {
    let mut queue = Vec::with_capacity(children.len());
    let mut foreign = Vec::new();
    for child in children {
        match parse(child) {
            Some(contender) => queue.push(contender),
            None => foreign.push(child.as_str()),
        }
    }
    if !foreign.is_empty() {
        foreign.sort_unstable();
        return Err(foreign);
    }
    // Ties cannot happen for one parent; the name breaks them anyway so the order is total.
    queue.sort_unstable_by(|a, b| a.sequence.cmp(&b.sequence).then(a.name.cmp(b.name)));
    Ok(queue)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CURATOR: &str = "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-0000000042";

    #[test]
    fn parses_curator_nodes() {
        let c = parse(CURATOR).unwrap();
        assert_eq!(c.sequence, 42);
        assert_eq!(c.name, CURATOR);
        let wide = "_c_6C3B1F7E-0B9E-4D5C-9D1E-2F0A8C7B6E5D-lock-0000000004294967296";
        assert_eq!(parse(wide).unwrap().sequence, 4_294_967_296);
    }

    #[test]
    fn our_prefix_has_the_layout() {
        let uuid = uuid::Uuid::new_v4();
        let name = format!("{}0000000007", prefix(&uuid));
        assert_eq!(parse(&name).unwrap().sequence, 7);
        assert!(name.starts_with(&uuid_prefix(&uuid)));
        // Curator's `isProtectedZNode`: longer than 40 characters, `-` at index 39.
        assert!(name.len() > 40 && name.as_bytes()[39] == b'-');
    }

    #[test]
    fn rejects_other_layouts() {
        for name in [
            "lock-0000000001",
            "_c_not-a-uuid-lock-0000000001",
            "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-latch-0000000001",
            "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-000000001",
            "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-00000000012345678901",
            "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-00000000x1",
            "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock--000000001",
            "_c_6c3b1f7e_0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-0000000001",
            "_c_🔒",
            "",
        ] {
            assert_eq!(parse(name), None, "{name}");
        }
    }

    #[test]
    fn sorts_numerically_and_names_foreign_children() {
        let children: Vec<String> = [
            "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-0000000010",
            "_c_7c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-0000000009",
            "_c_8c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-0000000000000000011",
        ]
        .map(String::from)
        .to_vec();
        let queue = contenders(&children).unwrap();
        let seqs: Vec<u64> = queue.iter().map(|c| c.sequence).collect();
        assert_eq!(seqs, [9, 10, 11]);
        let mut with_foreign = children.clone();
        with_foreign.push("planted".into());
        assert_eq!(contenders(&with_foreign).unwrap_err(), ["planted"]);
    }
}
