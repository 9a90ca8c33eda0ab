//! Redlock's push wake-ups: a waiter listens for releases on every server, so the first in
//! line votes as soon as one server tells it the lock was released, instead of at its next
//! poll.
//!
//! Each server has its own pub/sub connection per client ([`Waiters`], opened at the first
//! wait), and every server knows the client by the same id, so each server's release names the
//! client of its first two waiters (see [`crate::scripts::RELEASE`]). A waiter counts on push
//! only while a majority of servers confirmed its subscription; its votes then mark the lock
//! as waited for, so that releases publish. Polling goes on as the fallback, slower while push
//! works: a lost message costs at most one poll (see [`super::QUEUED_POLL_MAX`], and
//! [`super::PLACE_KEPT`] further back than second in line); the place in
//! line is kept (the ticket is), but the turn may go to the second in line meanwhile.

use std::{
    pin::Pin,
    sync::Arc,
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

/// Armed wake-ups (see [`Listening::arm`]): release messages that name the waiter first, and
/// those that name it second.
pub(super) struct Armed<'a> {
    first: Vec<Pin<Box<Notified<'a>>>>,
    second: Vec<Pin<Box<Notified<'a>>>>,
}

impl Armed<'_> {
    /// Sleeps until `until` (or the `deadline`), or until a server's release names this waiter
    /// first in line; when one names it second, until [`SECOND_STEPS_IN`] after that at the
    /// latest.
    pub(super) async fn sleep(mut self, mut until: Instant, deadline: Instant) {
        if self.first.is_empty() {
            // No server (a configuration the backend refuses): nothing to listen to.
            tokio::time::sleep_until(until.min(deadline).into()).await;
            return;
        }
        let mut second = select_all(self.second.iter_mut().map(Pin::as_mut));
        let mut stepping_in = false;
        loop {
            let first = select_all(self.first.iter_mut().map(Pin::as_mut));
            tokio::select! {
                _ = first => return,
                () = tokio::time::sleep_until(until.min(deadline).into()) => return,
                _ = &mut second, if !stepping_in => {
                    // Named second: step in once the first one's turn could be over.
                    stepping_in = true;
                    until = until.min(Instant::now() + SECOND_STEPS_IN);
                }
            }
        }
    }
}
