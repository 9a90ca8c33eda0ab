//! [`Lease`], [`LeaseToken`], [`Grant`] and [`LockInfo`]: what the store says about a hold.

use std::{
    fmt,
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{Fence, LockName, end_signal::EndSignal};

/// The owner token of a lease: at least 128 random bits, unique per acquisition.
///
/// It is the proof of ownership a store checks before renewing or releasing, so it is never
/// logged and its `Debug` output is redacted.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A fresh token of 128 random bits, as 32 lowercase hex digits.
    pub fn random() -> Self {
        Self(format!("{:032x}", rand::random::<u128>()))
    }

    /// Wraps a token a backend read from its store or built in its own format.
    pub fn from_store(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A fingerprint of the token for operators and logs: 16 hex digits of a 64-bit FNV-1a
    /// hash. It tells holders apart; it cannot be turned back into the token, so showing it
    /// gives nobody the power to release or renew the lease.
    pub fn fingerprint(&self) -> String {
        let hash = self
            .0
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
            });
        format!("{hash:016x}")
    }

    /// Whether the token has the shape of [`LeaseToken::random`] (32 lowercase hex digits).
    /// Backends use this to recognise values they did not write.
    pub fn is_random_format(text: &str) -> bool {
        text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(<redacted>)")
    }
}

/// What a successful acquisition returns: the store's record of one hold.
///
/// A lease is `Serialize + Deserialize`: where the backend declares
/// [`portable_lease`](crate::Capabilities::portable_lease), a lease written by one process can
/// be renewed or released by another (see [`LockClient::release_lease`](crate::LockClient::release_lease)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lease {
    name: LockName,
    token: LeaseToken,
    fence: Fence,
    #[serde(with = "humantime_serde")]
    ttl: Duration,
    expires_at: Option<SystemTime>,
}

impl Lease {
    /// A lease for `name` with its owner token, fence and TTL (no expiry instant known).
    pub fn new(name: LockName, token: LeaseToken, fence: Fence, ttl: Duration) -> Self {
        Self {
            name,
            token,
            fence,
            ttl,
            expires_at: None,
        }
    }

    /// Sets when the lease expires by the store's clock, where the store reports it.
    pub fn with_expires_at(mut self, expires_at: SystemTime) -> Self {
        self.expires_at = Some(expires_at);
        self
    }

    /// Sets the TTL the lease was last granted or renewed for.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The owner token.
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }

    /// The fencing token issued with this acquisition.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The TTL the lease was last granted or renewed for (for session stores: the session
    /// timeout).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the lease expires by the store's clock, if the store reports it.
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }
}

/// A lease just granted or renewed, with the local instant it is valid from.
///
/// `valid_from` is a monotonic instant no later than the moment the store started the lease's
/// TTL: backends take it just before sending the request that succeeded. The guard's local
/// deadline is `valid_from + ttl - drift`.
///
/// A backend that learns by itself when the store ends a hold (a dedicated connection closing,
/// a session expiring) attaches an [`EndSignal`] with [`Grant::with_end`] to the grant of an
/// acquisition, so the hold is lost the moment the store ends it rather than at the next
/// renewal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Grant {
    /// The lease.
    pub lease: Lease,
    /// When the request that obtained the lease was sent.
    pub valid_from: Instant,
    end: Option<EndSignal>,
}

impl Grant {
    /// A grant of `lease`, valid from `valid_from`.
    pub fn new(lease: Lease, valid_from: Instant) -> Self {
        Self {
            lease,
            valid_from,
            end: None,
        }
    }

    /// Attaches the signal by which the backend reports that the store ended the hold (read
    /// on the grant of an acquisition; renewals keep the acquisition's signal).
    pub fn with_end(mut self, end: EndSignal) -> Self {
        self.end = Some(end);
        self
    }

    /// The local deadline of this grant on the monotonic clock: `valid_from + ttl` minus the
    /// drift allowance (TTL/100 + 2 ms). A guard trusts its hold until then, unless renewed.
    pub fn local_deadline(&self) -> Instant {
        local_deadline(self.valid_from, self.lease.ttl())
    }

    /// Whether the grant is already past its [local deadline](Grant::local_deadline): a guard
    /// made of it would not be held.
    pub fn is_past_deadline(&self) -> bool {
        Instant::now() >= self.local_deadline()
    }

    /// The end signal attached with [`Grant::with_end`], if any.
    pub fn end(&self) -> Option<&EndSignal> {
        self.end.as_ref()
    }
}

/// The margin kept between the store's expiry and the local deadline: TTL/100 + 2 ms (the
/// clock-drift allowance of Redlock), so the client gives the lock up before the store does.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The local deadline of a lease valid from `valid_from` for `ttl`: `valid_from + ttl` minus
/// the drift allowance (TTL/100 + 2 ms, Redlock's), on the monotonic clock. A guard trusts its
/// hold until then unless a renewal is confirmed; a backend can use it to refuse handing out
/// a grant that came back too late to be held at all.
///
/// ```
/// use std::time::{Duration, Instant};
///
/// let sent = Instant::now();
/// let deadline = lock_core::backend::local_deadline(sent, Duration::from_secs(1));
/// assert_eq!(deadline, sent + Duration::from_millis(988));
/// ```
pub fn local_deadline(valid_from: Instant, ttl: Duration) -> Instant {
    valid_from + ttl.saturating_sub(drift(ttl))
}

/// What [`LockBackend::inspect`](crate::LockBackend::inspect) reports about a held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name.
    pub name: LockName,
    /// The current owner token (compare with [`Lease::token`] to know whether it is yours).
    pub token: LeaseToken,
    /// The current holder's fence.
    pub fence: Fence,
    /// Time left before the lease expires, for TTL stores.
    pub expires_in: Option<Duration>,
}

impl LockInfo {
    /// Information about a current hold.
    pub fn new(
        name: LockName,
        token: LeaseToken,
        fence: Fence,
        expires_in: Option<Duration>,
    ) -> Self {
        Self {
            name,
            token,
            fence,
            expires_in,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_redacted() {
        let a = LeaseToken::random();
        let b = LeaseToken::random();
        assert_ne!(a, b);
        assert!(LeaseToken::is_random_format(a.as_str()));
        assert!(!LeaseToken::is_random_format("not-a-token"));
        assert!(!format!("{a:?}").contains(a.as_str()));
    }

    #[test]
    fn lease_round_trips_through_serde() {
        let lease = Lease::new(
            LockName::new("a").unwrap(),
            LeaseToken::random(),
            Fence::new(7),
            Duration::from_millis(1500),
        )
        .with_expires_at(SystemTime::UNIX_EPOCH + Duration::from_secs(10));
        let json = serde_json::to_string(&lease).unwrap();
        let back: Lease = serde_json::from_str(&json).unwrap();
        assert_eq!(back, lease);
    }
}
