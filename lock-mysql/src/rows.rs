//! Reading lock rows back and judging them: ours (free or held) or foreign — a row this
//! library did not write, which is reported as [`LockError::Foreign`] and never granted.

use lock_core::{Fence, LockError, LockName, backend::LeaseToken};
use sqlx::{Row, mysql::MySqlRow};

use crate::TableName;

/// The SQL condition, on a lease row, for "ours and free to take": released (token and expiry
/// NULL) or a well-formed lease whose expiry has passed by the server clock. It matches
/// exactly the rows [`LeaseRow::judge`] finds `Free` or `Held` with no time left, so the
/// acquire statement never takes over a row the client would call foreign.
pub(crate) const LEASE_TAKEABLE: &str = "((token IS NULL AND expires_at IS NULL) \
     OR (expires_at <= NOW(6) AND acquired_at IS NOT NULL \
         AND LENGTH(token) = 32 AND LOWER(HEX(UNHEX(token))) = token)) \
     AND fence < 18446744073709551615";

/// The SQL condition, on a lease row, for "released while nobody queued": token, expiry and
/// `acquired_at` NULL, below the fence maximum. A release that finds no live place in the
/// waiters' queue leaves the row so (see `lease::queue::release_alone`); a caller with no
/// place of its own takes such a row with a statement that does not read the queue (see
/// `lease::acquire`). A row [`LeaseRow::judge`] finds `Free`.
pub(crate) const LEASE_RELEASED_ALONE: &str = "token IS NULL AND expires_at IS NULL \
     AND acquired_at IS NULL AND fence < 18446744073709551615";

/// The SQL condition, on a lease row, for "the current lease with this token and fence": the
/// rows [`LeaseRow::judge`] finds [`LeaseState::Held`] with that token and fence and time left
/// by the server clock (a live lease of this library). Renewal and release change a row only
/// under it, so they never touch a row `acquire` would call foreign; a lease whose token does
/// not have this library's shape is refused before anything is sent
/// ([`lease_token_is_ours`]). `token` and `fence` are SQL operands (`?`, or literals).
pub(crate) fn lease_current(token: &str, fence: &str) -> String {
    format!(
        "token = {token} AND fence = {fence} AND expires_at > NOW(6) AND acquired_at IS NOT NULL"
    )
}

/// Whether `token` has the shape of a token this library writes (32 lowercase hex digits): a
/// lease with any other token (forged, or deserialized from a foreign value) is no lease of
/// this library, and renewing or releasing it answers `NotHeld` without asking the store.
pub(crate) fn lease_token_is_ours(token: &LeaseToken) -> bool {
    LeaseToken::is_random_format(token.as_str())
}

/// The columns [`LeaseRow::read`] expects.
pub(crate) const LEASE_COLUMNS: &str = "token, fence, expires_at IS NULL, acquired_at IS NULL, \
     TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at)";

/// A lease-table row as read, before judging.
#[derive(Debug, Clone)]
pub(crate) struct LeaseRow {
    token: Option<Vec<u8>>,
    fence: u64,
    expires_null: bool,
    acquired_null: bool,
    /// Microseconds until expiry by the server clock (negative: expired).
    remaining_us: Option<i64>,
}

/// What a lease row means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseState {
    /// Released: only the fence counter remains.
    Free { fence: u64 },
    /// A lease written by this library; `remaining_us <= 0` means it has expired.
    Held {
        token: LeaseToken,
        fence: Fence,
        remaining_us: i64,
    },
}

impl LeaseState {
    /// A row acquire cannot take: free or expired, but its fence is at the maximum, so no
    /// next fence exists. The [`LockError::Foreign`] acquire answers for it, if it is one.
    pub(crate) fn exhausted(&self, table: &TableName, name: &LockName) -> Option<LockError> {
        let fence = match self {
            Self::Free { fence } => *fence,
            Self::Held {
                fence,
                remaining_us,
                ..
            } if *remaining_us <= 0 => fence.get(),
            Self::Held { .. } => return None,
        };
        (fence == u64::MAX).then(|| LockError::foreign(name.to_string(), format!(
                "the row of table `{table}` has its fence at the maximum (18446744073709551615): no fence is left to issue"
            )))
    }
}

impl LeaseRow {
    /// Reads [`LEASE_COLUMNS`] starting at column `at` (after a tag column, if any).
    pub(crate) fn read(row: &MySqlRow, at: usize) -> Result<Self, sqlx::Error> {
        Ok(Self {
            token: row.try_get(at)?,
            fence: row.try_get(at + 1)?,
            expires_null: row.try_get::<i64, _>(at + 2)? != 0,
            acquired_null: row.try_get::<i64, _>(at + 3)? != 0,
            remaining_us: row.try_get(at + 4)?,
        })
    }

    /// Judges the row of `name` in `table`: the one judgment every path uses (acquire's
    /// read-back, inspect, batched renewal; renewal and release through the equivalent SQL,
    /// [`lease_current`]). A row at the top fence is a lease like any other while it is held;
    /// once free or expired, [`LeaseState::exhausted`] tells acquire no fence is left for it.
    ///
    /// # Errors
    /// [`LockError::Foreign`] describing what is wrong with a row this library did not write.
    pub(crate) fn judge(
        &self,
        table: &TableName,
        name: &LockName,
    ) -> Result<LeaseState, LockError> {
        let foreign = |what: String| {
            Err(LockError::foreign(
                name.to_string(),
                format!("the row of table `{table}` {what}"),
            ))
        };
        match (&self.token, self.expires_null) {
            (None, true) => Ok(LeaseState::Free { fence: self.fence }),
            (None, false) => foreign("has an expiry but no owner token".into()),
            (Some(token), _) => {
                let Some(token) = lease_token(token) else {
                    return foreign(format!(
                        "has the owner token {} (not 32 lowercase hex digits)",
                        describe(token)
                    ));
                };
                let remaining_us = match self.remaining_us {
                    Some(us) if !self.expires_null => us,
                    _ => return foreign("has an owner token but no expiry".into()),
                };
                if self.acquired_null {
                    return foreign("has an owner token but no acquired_at".into());
                }
                Ok(LeaseState::Held {
                    token,
                    fence: Fence::new(self.fence),
                    remaining_us,
                })
            }
        }
    }
}

/// The columns [`HoldRow::read`] expects.
pub(crate) const HOLD_COLUMNS: &str = "token, fence, acquired_at IS NULL, connection_id";

/// A row-lock row as read (committed or, with `READ UNCOMMITTED`, as the holder wrote it).
#[derive(Debug, Clone)]
pub(crate) struct HoldRow {
    token: Option<Vec<u8>>,
    fence: u64,
    acquired_null: bool,
    connection_id: Option<u64>,
}

/// What a row-lock row means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HoldState {
    /// Nobody's hold is written in it.
    Free,
    /// A holder's uncommitted record: its token and fence.
    Held { token: LeaseToken, fence: Fence },
}

impl HoldRow {
    /// Reads [`HOLD_COLUMNS`] starting at column `at`.
    pub(crate) fn read(row: &MySqlRow, at: usize) -> Result<Self, sqlx::Error> {
        Ok(Self {
            token: row.try_get(at)?,
            fence: row.try_get(at + 1)?,
            acquired_null: row.try_get::<i64, _>(at + 2)? != 0,
            connection_id: row.try_get(at + 3)?,
        })
    }

    /// Judges the committed state of the row: holders never commit, so anything but an empty
    /// row was written by someone else.
    ///
    /// # Errors
    /// [`LockError::Foreign`] describing the row.
    pub(crate) fn judge_committed(
        &self,
        table: &TableName,
        name: &LockName,
    ) -> Result<(), LockError> {
        if self.token.is_none()
            && self.fence == 0
            && self.acquired_null
            && self.connection_id.is_none()
        {
            return Ok(());
        }
        let token = self.token.as_deref().map_or_else(
            || "no token".to_owned(),
            |t| format!("the token {}", describe(t)),
        );
        Err(LockError::foreign(
            name.to_string(),
            format!(
                "the row of table `{table}` has committed values (fence {}, {token}); this library never commits a hold",
                self.fence
            ),
        ))
    }

    /// Judges a row read with `READ UNCOMMITTED`: the current holder's record, if any.
    ///
    /// # Errors
    /// [`LockError::Foreign`] for a token this library did not write.
    pub(crate) fn judge_current(
        &self,
        table: &TableName,
        name: &LockName,
    ) -> Result<HoldState, LockError> {
        match &self.token {
            None => Ok(HoldState::Free),
            Some(raw) => match lease_token(raw) {
                Some(token) => Ok(HoldState::Held {
                    token,
                    fence: Fence::new(self.fence),
                }),
                None => Err(LockError::foreign(
                    name.to_string(),
                    format!(
                        "the row of table `{table}` has the owner token {} (not 32 lowercase hex digits)",
                        describe(raw)
                    ),
                )),
            },
        }
    }
}

/// `raw` as a token of this library, if it has the shape of one.
fn lease_token(raw: &[u8]) -> Option<LeaseToken> {
    std::str::from_utf8(raw)
        .ok()
        .filter(|text| LeaseToken::is_random_format(text))
        .map(LeaseToken::from_store)
}

/// A foreign value for a message: quoted text when it is short printable UTF-8, else hex.
fn describe(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(text) if text.len() <= 64 && !text.chars().any(char::is_control) => format!("{text:?}"),
        _ => {
            let shown: String = raw.iter().take(32).map(|b| format!("{b:02x}")).collect();
            let more = if raw.len() > 32 { "..." } else { "" };
            format!("0x{shown}{more} ({} bytes)", raw.len())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> LockName {
        LockName::new("jobs/1").unwrap()
    }

    fn table() -> TableName {
        TableName::new("locks").unwrap()
    }

    fn lease(token: Option<&[u8]>, expires: Option<i64>, acquired: bool) -> LeaseRow {
        LeaseRow {
            token: token.map(<[u8]>::to_vec),
            fence: 3,
            expires_null: expires.is_none(),
            acquired_null: !acquired,
            remaining_us: expires,
        }
    }

    const TOKEN: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn lease_rows_of_ours() {
        assert_eq!(
            lease(None, None, true).judge(&table(), &name()).unwrap(),
            LeaseState::Free { fence: 3 }
        );
        assert_eq!(
            lease(None, None, false).judge(&table(), &name()).unwrap(),
            LeaseState::Free { fence: 3 }
        );
        match lease(Some(TOKEN), Some(-5), true).judge(&table(), &name()) {
            Ok(LeaseState::Held {
                remaining_us,
                fence,
                ..
            }) => {
                assert_eq!(remaining_us, -5);
                assert_eq!(fence, Fence::new(3));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_top_fence_is_a_lease_while_held_and_exhausted_once_free() {
        let top = |token: Option<&[u8]>, expires: Option<i64>| LeaseRow {
            fence: u64::MAX,
            ..lease(token, expires, true)
        };
        let held = top(Some(TOKEN), Some(10)).judge(&table(), &name()).unwrap();
        assert!(matches!(held, LeaseState::Held { .. }));
        assert!(held.exhausted(&table(), &name()).is_none());
        for row in [top(None, None), top(Some(TOKEN), Some(-1))] {
            let state = row.judge(&table(), &name()).unwrap();
            let refused = state.exhausted(&table(), &name());
            assert!(
                matches!(&refused, Some(LockError::Foreign { found, .. }) if found.contains("maximum")),
                "{refused:?}"
            );
        }
        let free = lease(None, None, true).judge(&table(), &name()).unwrap();
        assert!(free.exhausted(&table(), &name()).is_none());
    }

    #[test]
    fn foreign_lease_rows_are_named() {
        let cases = [
            (
                lease(Some(b"not-a-token"), Some(10), true),
                "\"not-a-token\"",
            ),
            (
                lease(Some(b"0123456789ABCDEF0123456789abcdef"), Some(10), true),
                "not 32 lowercase",
            ),
            (
                lease(Some(&[0xff, 0x00]), Some(10), true),
                "0xff00 (2 bytes)",
            ),
            (lease(Some(TOKEN), None, true), "no expiry"),
            (lease(Some(TOKEN), Some(10), false), "no acquired_at"),
            (lease(None, Some(10), true), "no owner token"),
        ];
        for (row, why) in cases {
            match row.judge(&table(), &name()) {
                Err(LockError::Foreign { name, found }) => {
                    assert_eq!(name, "jobs/1");
                    assert!(found.contains("table `locks`"), "{found}");
                    assert!(found.contains(why), "{found} should say {why}");
                }
                other => panic!("{row:?} gave {other:?}"),
            }
        }
    }

    fn hold(token: Option<&[u8]>, fence: u64, acquired: bool, conn: Option<u64>) -> HoldRow {
        HoldRow {
            token: token.map(<[u8]>::to_vec),
            fence,
            acquired_null: !acquired,
            connection_id: conn,
        }
    }

    #[test]
    fn row_lock_rows() {
        hold(None, 0, false, None)
            .judge_committed(&table(), &name())
            .unwrap();
        for committed in [
            hold(Some(TOKEN), 0, false, None),
            hold(None, 4, false, None),
            hold(None, 0, true, None),
            hold(None, 0, false, Some(9)),
        ] {
            assert!(matches!(
                committed.judge_committed(&table(), &name()),
                Err(LockError::Foreign { .. })
            ));
        }
        assert_eq!(
            hold(None, 0, false, None)
                .judge_current(&table(), &name())
                .unwrap(),
            HoldState::Free
        );
        assert_eq!(
            hold(Some(TOKEN), 7, true, Some(12))
                .judge_current(&table(), &name())
                .unwrap(),
            HoldState::Held {
                token: LeaseToken::from_store(std::str::from_utf8(TOKEN).unwrap()),
                fence: Fence::new(7),
            }
        );
        assert!(matches!(
            hold(Some(b"zz"), 7, true, Some(12)).judge_current(&table(), &name()),
            Err(LockError::Foreign { .. })
        ));
    }

    #[test]
    fn long_values_are_shortened() {
        let long = vec![0x01; 100];
        let shown = describe(&long);
        assert!(shown.ends_with("... (100 bytes)"), "{shown}");
        assert_eq!(describe(b"abc"), "\"abc\"");
    }
}
