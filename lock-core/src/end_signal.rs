//! [`EndSignal`] and [`EndNotifier`]: how a backend tells lock-core, the moment it knows, that
//! the store ended a hold by itself (the dedicated connection holding a row lock closed, a
//! session expired), instead of waiting for the next renewal to find out.

use std::fmt;

use tokio::sync::watch;

use crate::LossReason;

/// A backend's half of an end signal: call [`EndNotifier::end`] when the store has ended the
/// hold. Dropping the notifier without calling `end` says nothing (a normal release drops it).
///
/// ```
/// use lock_core::{LossReason, backend::end_signal};
///
/// let (notifier, signal) = end_signal();
/// assert_eq!(signal.ended_now(), None);
/// notifier.end(LossReason::SessionEnded);
/// assert_eq!(signal.ended_now(), Some(LossReason::SessionEnded));
/// ```
pub struct EndNotifier {
    tx: watch::Sender<Option<LossReason>>,
}

/// lock-core's half of an end signal, attached to a [`Grant`](crate::backend::Grant) with
/// [`Grant::with_end`](crate::backend::Grant::with_end): the hold is lost as soon as it fires
/// (`is_held()` turns false and `lost()` resolves with the reason).
#[derive(Clone)]
pub struct EndSignal {
    rx: watch::Receiver<Option<LossReason>>,
}

/// A new, linked notifier and signal.
pub fn end_signal() -> (EndNotifier, EndSignal) {
    let (tx, rx) = watch::channel(None);
    (EndNotifier { tx }, EndSignal { rx })
}

impl EndNotifier {
    /// Tells the signal the store ended the hold. Only the first reason counts.
    pub fn end(&self, reason: LossReason) {
        self.tx.send_if_modified(|now| {
            if now.is_none() {
                *now = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Whether nobody listens any more (the hold is over on lock-core's side), so a backend can
    /// stop watching its store for it.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl EndSignal {
    /// The reason, if the store has ended the hold.
    pub fn ended_now(&self) -> Option<LossReason> {
        *self.rx.borrow()
    }

    /// Resolves with the reason when the store ends the hold; never resolves if the notifier
    /// is dropped without calling [`EndNotifier::end`].
    pub(crate) async fn ended(&self) -> LossReason {
        let mut rx = self.rx.clone();
        loop {
            if let Some(reason) = *rx.borrow_and_update() {
                return reason;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

impl fmt::Debug for EndNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndNotifier")
            .field("ended", &*self.tx.borrow())
            .finish()
    }
}

impl fmt::Debug for EndSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndSignal")
            .field("ended", &self.ended_now())
            .finish()
    }
}
