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
    /// Ended when any of these has (one for a single hold; several for a hold made of
    /// several, see [`EndSignal::any`]).
    rxs: Vec<watch::Receiver<Option<LossReason>>>,
}

/// A new, linked notifier and signal.
pub fn end_signal() -> (EndNotifier, EndSignal) {
    let (tx, rx) = watch::channel(None);
    (EndNotifier { tx }, EndSignal { rxs: vec![rx] })
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
    /// One signal that ends when either of `a` and `b` does, with its reason: the end of a
    /// hold made of two (a migration's dual hold). Read as directly as either, with no task
    /// in between.
    pub fn any(a: &Self, b: &Self) -> Self {
        Self {
            rxs: a.rxs.iter().chain(&b.rxs).cloned().collect(),
        }
    }

    /// The reason, if the store has ended the hold.
    pub fn ended_now(&self) -> Option<LossReason> {
        self.rxs.iter().find_map(|rx| *rx.borrow())
    }

    /// Resolves with the reason when the store ends the hold; never resolves if every
    /// notifier is dropped without calling [`EndNotifier::end`].
    pub async fn ended(&self) -> LossReason {
        let waits = self.rxs.iter().cloned().map(|mut rx| {
            Box::pin(async move {
                loop {
                    if let Some(reason) = *rx.borrow_and_update() {
                        return reason;
                    }
                    if rx.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
            })
        });
        if self.rxs.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(waits).await.0
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
