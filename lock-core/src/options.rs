//! [`LockOptions`] and [`Backoff`]: how long to hold, wait and renew.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use serde::{Deserialize, Serialize};

use crate::LockError;

/// The shortest TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The longest TTL accepted.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The shortest renewal interval accepted.
pub const MIN_RENEW_EVERY: Duration = Duration::from_millis(1);
/// The longest wait budget accepted (acquire in a loop to wait longer).
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// How a lock is held and waited for. Built with chained setters; validated when used, so a
/// bad value is reported as [`LockError::InvalidOptions`] before anything reaches the store.
///
/// Defaults (documented choices, see the crate docs): TTL 30 s, wait budget 10 s, renewal every
/// TTL/3 by a background watchdog, no `max_hold`, back-off from 10 ms to 500 ms with jitter.
/// Serialized durations are text such as `"500ms"` or `"1m 30s"` (as in every config of this
/// workspace); missing fields take their defaults.
///
/// ```
/// use std::time::Duration;
/// use lock_core::LockOptions;
///
/// let options = LockOptions::new()
///     .ttl(Duration::from_secs(5))
///     .wait(Duration::from_millis(200))
///     .max_hold(Duration::from_secs(60));
/// assert!(options.validate().is_ok());
/// assert!(LockOptions::new().ttl(Duration::ZERO).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct LockOptions {
    /// How long a lease lasts unless renewed.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How long `acquire` may wait for the lock; zero means one try.
    #[serde(with = "humantime_serde")]
    pub wait: Duration,
    /// How often the watchdog renews; `None` means TTL/3.
    #[serde(with = "humantime_serde")]
    pub renew_every: Option<Duration>,
    /// The longest the watchdog keeps the lock; `None` means as long as the guard lives.
    #[serde(with = "humantime_serde")]
    pub max_hold: Option<Duration>,
    /// Whether a background watchdog renews the lease.
    pub watchdog: bool,
    /// Back-off between tries on stores without push wake-ups, and between retries.
    pub backoff: Backoff,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: Duration::from_secs(10),
            renew_every: None,
            max_hold: None,
            watchdog: true,
            backoff: Backoff::default(),
        }
    }
}

impl LockOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lease TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the wait budget of `acquire` (zero = one try).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the watchdog's renewal interval (must be shorter than the TTL).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Caps how long the watchdog keeps the lock (a cap too large to be an instant, such as
    /// `Duration::MAX`, means no cap).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Turns the background watchdog on or off.
    pub fn watchdog(mut self, enabled: bool) -> Self {
        self.watchdog = enabled;
        self
    }

    /// Sets the back-off.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The renewal interval in force: [`LockOptions::renew_every`] or TTL/3.
    pub fn renew_interval(&self) -> Duration {
        self.renew_every.unwrap_or(self.ttl / 3)
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the value, what it was and what is allowed.
    pub fn validate(&self) -> Result<(), LockError> {
        validate_ttl(self.ttl)?;
        if self.wait > MAX_WAIT {
            return Err(LockError::invalid_options(format!(
                "wait budget is {:?}; the maximum is {MAX_WAIT:?} (acquire in a loop to wait longer)",
                self.wait
            )));
        }
        if let Some(every) = self.renew_every
            && (every < MIN_RENEW_EVERY || every >= self.ttl)
        {
            return Err(LockError::invalid_options(format!(
                "renew_every is {every:?} with a ttl of {:?}; it must be at least {MIN_RENEW_EVERY:?} and shorter than the ttl",
                self.ttl
            )));
        }
        if let Some(max_hold) = self.max_hold
            && max_hold < self.ttl
        {
            return Err(LockError::invalid_options(format!(
                "max_hold is {max_hold:?}, shorter than the ttl of {:?}; use a ttl no longer than max_hold",
                self.ttl
            )));
        }
        self.backoff.validate()
    }
}

/// Checks a TTL on its own (for `extend` and for backends called directly).
///
/// # Errors
/// [`LockError::InvalidOptions`] when `ttl` is outside [`MIN_TTL`]..=[`MAX_TTL`].
pub fn validate_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(LockError::invalid_options(format!(
            "ttl is {ttl:?}; it must be between {MIN_TTL:?} and {MAX_TTL:?}"
        )));
    }
    Ok(())
}

/// Exponential back-off with full jitter, for stores without push wake-ups and for retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Backoff {
    /// The first delay.
    #[serde(with = "humantime_serde")]
    pub min: Duration,
    /// The largest delay.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Whether delays are randomised (recommended: it spreads contending clients).
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(10),
            max: Duration::from_millis(500),
            jitter: true,
        }
    }
}

impl Backoff {
    /// A back-off from `min` to `max`, with jitter.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            jitter: true,
        }
    }

    /// Checks the bounds.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] when `min` is zero, `min > max`, or `max` is over 60 s.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.min.is_zero() || self.min > self.max || self.max > Duration::from_secs(60) {
            return Err(LockError::invalid_options(format!(
                "backoff is {:?}..{:?}; it needs 0 < min <= max <= 60s",
                self.min, self.max
            )));
        }
        Ok(())
    }

    /// An endless sequence of delays (exponential, capped at `max`, jittered when enabled).
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        let mut builder = ExponentialBuilder::default()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times();
        if self.jitter {
            builder = builder.with_jitter();
        }
        let max = self.max;
        builder.build().map(move |d| d.min(max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jitter spreads contending clients only if each draws its own delays: two sequences
    /// (two clients, or two waits of one) differ. (With `backon` built without its `std`
    /// feature every sequence came from one fixed seed: all clients slept alike.)
    #[test]
    fn jittered_delays_differ_between_waits() {
        let backoff = Backoff::default();
        let a: Vec<Duration> = backoff.delays().take(8).collect();
        let b: Vec<Duration> = backoff.delays().take(8).collect();
        assert_ne!(a, b, "two jittered sequences were the same: {a:?}");
    }

    #[test]
    fn defaults_are_valid() {
        LockOptions::default().validate().unwrap();
        assert_eq!(
            LockOptions::default().renew_interval(),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn each_bad_value_is_named() {
        let cases = [
            (LockOptions::new().ttl(Duration::ZERO), "ttl"),
            (LockOptions::new().ttl(Duration::from_secs(90_000)), "ttl"),
            (LockOptions::new().wait(Duration::from_secs(90_000)), "wait"),
            (
                LockOptions::new().renew_every(Duration::from_secs(30)),
                "renew_every",
            ),
            (
                LockOptions::new().renew_every(Duration::ZERO),
                "renew_every",
            ),
            (
                LockOptions::new().max_hold(Duration::from_secs(1)),
                "max_hold",
            ),
            (
                LockOptions::new()
                    .backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(1))),
                "backoff",
            ),
        ];
        for (options, word) in cases {
            let err = options.validate().unwrap_err();
            assert!(matches!(err, LockError::InvalidOptions { .. }));
            assert!(err.to_string().contains(word), "{err} should name {word}");
        }
    }

    #[test]
    fn durations_read_as_text() {
        let options: LockOptions =
            serde_json::from_str(r#"{"ttl": "5s", "wait": "250ms", "max_hold": "1m"}"#).unwrap();
        assert_eq!(options.ttl, Duration::from_secs(5));
        assert_eq!(options.wait, Duration::from_millis(250));
        assert_eq!(options.max_hold, Some(Duration::from_secs(60)));
        assert_eq!(options.backoff, Backoff::default());
        let json = serde_json::to_string(&options).unwrap();
        assert!(json.contains(r#""ttl":"5s""#), "{json}");
        assert_eq!(serde_json::from_str::<LockOptions>(&json).unwrap(), options);
    }

    #[test]
    fn delays_grow_and_stay_capped() {
        let b = Backoff {
            jitter: false,
            ..Backoff::new(Duration::from_millis(10), Duration::from_millis(80))
        };
        let d: Vec<_> = b.delays().take(6).collect();
        assert_eq!(d[0], Duration::from_millis(10));
        assert!(d.windows(2).all(|w| w[0] <= w[1]));
        assert!(d.iter().all(|x| *x <= Duration::from_millis(80)));
    }
}
