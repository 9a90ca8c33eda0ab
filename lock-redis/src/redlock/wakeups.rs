//! Redlock's push wake-ups: a waiter listens for releases on every server, so the first in
//! line votes as soon as a majority of servers told it the lock was released (or shortly after
//! the first did, see [`Armed::sleep`]), instead of at its next poll.
//!
//! Each server has its own pub/sub connection per client ([`Waiters`], opened at the first
//! wait), and every server knows the client by the same id, so each server's release names the
//! client of its first two waiters (see [`crate::scripts::RELEASE`]). A waiter counts on push
//! only while a majority of servers confirmed its subscription; its votes then mark the lock
//! as waited for, so that releases publish. Polling goes on as the fallback, slower while push
//! works: a lost message costs at most one poll, or 5 ms when messages from a majority were
//! awaited and too few came (see [`Armed::sleep`], [`super::QUEUED_POLL_MAX`], and
//! [`super::PLACE_KEPT`] further back than second in line, [`super::PLACE_KEPT_FAR`] from
//! [`super::FAR_BACK`] on); the place in
//! line is kept (the ticket is), but the turn may go to the second in line meanwhile.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures::{StreamExt, future::select_all, stream::FuturesUnordered};
use lock_core::LockError;
use tokio::sync::{Notify, futures::Notified};

use crate::{
    connection::{self, TlsRoots},
    scripts,
    subscriber::Subscriber,
    waiters::{Registration, Waiters},
};

/// When a waiter named second in line by a release votes, if no release named it first
/// before: once the first one's turn could be over.
const SECOND_STEPS_IN: Duration = Duration::from_millis(scripts::HANDOFF_MS + 5);

/// The pub/sub side of one Redlock client: a [`Waiters`] per server, under one client id.
#[derive(Debug)]
pub(super) struct Wakeups {
    servers: Vec<Arc<Waiters>>,
    id: u64,
}

impl Wakeups {
    /// Wake-ups from the servers at `urls`, each network step of their pub/sub connections
    /// bounded by `timeout`. Nothing is connected until a waiter listens.
    pub(super) fn new(urls: &[String], timeout: Duration) -> Result<Self, LockError> {
        let id = rand::random::<u64>().max(1);
        let servers = urls
            .iter()
            .map(|url| {
                let client = connection::client(url, &TlsRoots::default())?;
                Ok(Waiters::with_id(Subscriber::Single(client), timeout, id))
            })
            .collect::<Result<_, LockError>>()?;
        Ok(Self { servers, id })
    }

    /// The client id every server knows this client's waiters by.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Listens for releases of the lock whose release channels stem from `stem`, for the
    /// waiter whose owner token is `token`, on every server.
    pub(super) fn listen(&self, stem: &str, token: &str) -> Listening {
        Listening {
            registrations: self
                .servers
                .iter()
                .map(|waiters| waiters.register(&waiters.channel(stem), token))
                .collect(),
        }
    }
}

/// One waiter's registrations, one per server; dropping it unsubscribes where it was the
/// client's last waiter on the lock.
pub(super) struct Listening {
    registrations: Vec<Registration>,
}

impl Listening {
    /// Starts the subscriptions, without waiting for them.
    pub(super) fn start(&self) {
        for registration in &self.registrations {
            registration.start();
        }
    }

    /// Subscribes where needed and waits, until `by` at most, for `quorum` servers to confirm
    /// (subscriptions still under way go on in the background). True when push wake-ups work;
    /// false as soon as too few can still confirm.
    pub(super) async fn ensure(&self, quorum: usize, by: Instant) -> bool {
        let mut pending: FuturesUnordered<_> = self
            .registrations
            .iter()
            .map(|registration| registration.ensure(by))
            .collect();
        let mut confirmed = 0;
        while let Some(subscribed) = pending.next().await {
            confirmed += usize::from(subscribed);
            if confirmed >= quorum {
                return true;
            }
            if confirmed + pending.len() < quorum {
                return false;
            }
        }
        false
    }

    /// For each server, whether this waiter's subscription there is confirmed now: a vote
    /// records the client (whose channel releases name the waiter on) only on those, so that
    /// a server where it does not listen (yet, or any more) does not take it for a waiter that
    /// died (see `scripts::drop_deaf_heads`).
    pub(super) fn subscribed(&self) -> Vec<bool> {
        self.registrations
            .iter()
            .map(Registration::subscribed)
            .collect()
    }

    /// Starts listening for the release messages that name this waiter (first or second in
    /// line): armed before a vote, so that a release between the vote's answer and the sleep is
    /// not missed.
    pub(super) fn arm(&self) -> Armed<'_> {
        Armed {
            first: self
                .registrations
                .iter()
                .map(|registration| armed(registration.named_first()))
                .collect(),
            second: self
                .registrations
                .iter()
                .map(|registration| armed(registration.named_second()))
                .collect(),
        }
    }
}

/// A wake-up from `notify`, enabled now: a notification from then on is not missed.
fn armed(notify: &Notify) -> Pin<Box<Notified<'_>>> {
    let mut notified = Box::pin(notify.notified());
    notified.as_mut().enable();
    notified
}

/// Sleeps as [`Armed::sleep`] does when `armed`, else until `until`. True when a release named
/// the waiter.
pub(super) async fn sleep(
    armed: Option<Armed<'_>>,
    until: Instant,
    deadline: Instant,
    quorum: usize,
) -> bool {
    match armed {
        Some(armed) => armed.sleep(until, deadline, quorum).await,
        None => {
            tokio::time::sleep_until(until.min(deadline).into()).await;
            false
        }
    }
}

/// Armed wake-ups (see [`Listening::arm`]): release messages that name the waiter first, and
/// those that name it second.
pub(super) struct Armed<'a> {
    first: Vec<Pin<Box<Notified<'a>>>>,
    second: Vec<Pin<Box<Notified<'a>>>>,
}

impl Armed<'_> {
    /// Sleeps until `until` (or the `deadline`), or until the servers' releases name this
    /// waiter first in line: once `quorum` servers did, or [`GATHER`] after the first did,
    /// whichever comes first; when one names it second, until [`SECOND_STEPS_IN`] after that
    /// at the latest. True when a release named it (first or second), false when the time ran
    /// out without one.
    pub(super) async fn sleep(
        mut self,
        mut until: Instant,
        deadline: Instant,
        quorum: usize,
    ) -> bool {
        if self.first.is_empty() {
            // No server (a configuration the backend refuses): nothing to listen to.
            tokio::time::sleep_until(until.min(deadline).into()).await;
            return false;
        }
        let mut named = false;
        let mut second = select_all(self.second.iter_mut().map(Pin::as_mut));
        let mut stepping_in = false;
        let mut heard = vec![false; self.first.len()];
        let mut gathering = false;
        loop {
            let first = Heard {
                notified: &mut self.first,
                heard: &mut heard,
            };
            tokio::select! {
                count = first => {
                    named = true;
                    if count >= quorum.min(heard.len()) {
                        return true;
                    }
                    if !gathering {
                        // The release reached one server; the others are a moment behind.
                        gathering = true;
                        // Tokio's clock (the same as the system's, unless a test pauses it).
                        until = until.min(tokio::time::Instant::now().into_std() + GATHER);
                    }
                }
                () = tokio::time::sleep_until(until.min(deadline).into()) => return named,
                _ = &mut second, if !stepping_in => {
                    named = true;
                    // Named second: step in once the first one's turn could be over.
                    stepping_in = true;
                    until = until.min(Instant::now() + SECOND_STEPS_IN);
                }
            }
        }
    }
}

/// How long a waiter named first by one server's release waits for the others' before it
/// votes (see [`Armed::sleep`]): the releaser asks every server at once, so their messages
/// come close together, and a vote sent on the first alone finds the lock still held on
/// servers the release has not reached yet, and fails.
const GATHER: Duration = Duration::from_millis(5);

/// Ready with how many servers have named the waiter first so far, each time one more has.
struct Heard<'a, 'n> {
    notified: &'a mut Vec<Pin<Box<Notified<'n>>>>,
    heard: &'a mut Vec<bool>,
}

impl Future for Heard<'_, '_> {
    type Output = usize;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        let this = self.get_mut();
        let mut more = false;
        for (notified, heard) in this.notified.iter_mut().zip(this.heard.iter_mut()) {
            if !*heard && notified.as_mut().poll(cx).is_ready() {
                *heard = true;
                more = true;
            }
        }
        if more {
            Poll::Ready(this.heard.iter().filter(|h| **h).count())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five servers' notifications, and a waiter armed on them.
    fn armed_on<'a>(first: &'a [Notify], second: &'a [Notify]) -> Armed<'a> {
        Armed {
            first: first.iter().map(armed).collect(),
            second: second.iter().map(armed).collect(),
        }
    }

    /// A waiter named first by a majority of servers votes at once; named first by one server
    /// only, it waits [`GATHER`] for the others' releases (before, it voted at once, and the
    /// vote found the lock still held where the release had not come yet); a third message
    /// within the gather ends it. Time is paused and read on Tokio's clock.
    #[tokio::test(start_paused = true)]
    async fn one_server_naming_the_waiter_first_is_gathered_with_the_others() {
        use tokio::time::Instant as Clock;
        let (first, second): (Vec<Notify>, Vec<Notify>) =
            (0..5).map(|_| (Notify::new(), Notify::new())).unzip();
        let far = Clock::now().into_std() + Duration::from_secs(10);
        let timed = async |waiter: Armed<'_>| {
            let start = Clock::now();
            waiter.sleep(far, far, 3).await;
            start.elapsed()
        };

        let waiter = armed_on(&first, &second);
        for server in &first[..3] {
            server.notify_waiters();
        }
        assert_eq!(
            timed(waiter).await,
            Duration::ZERO,
            "a majority named it first"
        );

        let waiter = armed_on(&first, &second);
        first[2].notify_waiters();
        assert_eq!(timed(waiter).await, GATHER, "one server named it first");

        let waiter = armed_on(&first, &second);
        let (took, ()) = tokio::join!(timed(waiter), async {
            first[0].notify_waiters();
            tokio::time::sleep(Duration::from_millis(1)).await;
            first[4].notify_waiters();
            tokio::time::sleep(Duration::from_millis(1)).await;
            first[1].notify_waiters();
        });
        assert_eq!(
            took,
            Duration::from_millis(2),
            "the third message ended the gather"
        );
    }
}
