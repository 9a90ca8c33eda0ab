//! [`RedlockBackend`]: Redlock over N independent Redis servers.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::join_all;
use lock_core::{
    AcquireRequest, Attempt, Capabilities, Clock, Expiry, Failover, Fencing, Grant, Lease,
    LeaseToken, LockBackend, LockError, LockInfo, LockName, WaitOrder, Wakeup, async_trait,
    poll_until_acquired,
};
use redis::Value;

use crate::{
    RedlockConfig,
    connection::Conn,
    error::timed_out,
    keys::RedisKeys as Keys,
    ops::{self, Try},
    scripts::Mark,
};

/// Redlock: a lock is held when a majority (N/2 + 1) of N independent servers granted it
/// within its validity.
///
/// - Requests go to every server in parallel, each bounded by a per-server time-out; the lock
///   is valid for `ttl - elapsed - drift` with `drift = ttl * 0.01 + 2 ms`, and the lease's
///   local deadline is computed the same way.
/// - A failed attempt releases on every server (a timed-out server may have granted), then
///   retries after a random delay: `lock_core::poll_until_acquired`'s jittered back-off,
///   bounded by the holder's TTL and the wait budget.
/// - Renewal must reach a majority within the validity.
/// - **Fences are best effort**. Each server proposes `max(its counter + 1, its clock in µs)`
///   (the acquire script of the single-server backend); the fence is the highest proposal of
///   the granting majority, and it is written back to that majority (`SET fence max(cur, F)`)
///   before the grant is returned. Any two majorities share a server, so while servers keep
///   their counters every fence is above every earlier one, whichever servers granted.
///   Fences can still repeat or go back only when servers **lose their counters** (a restart
///   without persistence, an eviction, `FLUSHALL`): when every server the next majority shares
///   with the last one lost its counter, the next fence comes from the other servers' counters
///   and from clocks, and repeats if those are behind the last fence (for example when a
///   server whose clock runs ahead made it). Use persistence (`appendonly yes`,
///   `appendfsync always`) and synchronized clocks where fencing must hold, or a backend whose
///   capabilities say `Strict`.
/// - **Mutual exclusion across a restart** (`Failover::Quorum`) needs what the Redlock
///   algorithm asks of operators: a server restarted without persistence has forgotten the
///   locks it granted, so it must stay down for at least the longest TTL in use before it
///   rejoins (a *delayed restart*). Otherwise a majority made of it and the servers that never
///   granted can grant a lock that is still held elsewhere.
/// - Waiting is by randomized retries (capabilities say `Poll`).
#[derive(Debug, Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nodes: Vec<Conn>,
    config: RedlockConfig,
}

/// The answer of one server to one request.
type Vote<T> = Result<T, LockError>;

impl RedlockBackend {
    /// Sets up connections to every server (made on first use, so a minority may be down).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a bad configuration or URL.
    pub async fn connect(config: RedlockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let nodes = config
            .urls
            .iter()
            .map(|url| Conn::lazy_single(url, config.node_timeout.max(Duration::from_millis(200))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            inner: Arc::new(Inner { nodes, config }),
        })
    }

    fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.inner.config.key_prefix, name)
    }

    fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    /// Runs `op` on every server in parallel, each within the per-server time-out.
    async fn everywhere<T, F, Fut>(&self, what: &'static str, op: F) -> Vec<Vote<T>>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, LockError>>,
    {
        self.on(self.inner.nodes.iter(), what, op).await
    }

    /// Runs `op` on `nodes` in parallel, each within the per-server time-out.
    async fn on<'a, T, F, Fut>(
        &self,
        nodes: impl Iterator<Item = &'a Conn>,
        what: &'static str,
        op: F,
    ) -> Vec<Vote<T>>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, LockError>>,
    {
        let timeout = self.inner.config.node_timeout;
        join_all(nodes.map(|conn| {
            let call = op(conn.clone());
            async move {
                tokio::time::timeout(timeout, call)
                    .await
                    .unwrap_or_else(|_| Err(timed_out(what)))
            }
        }))
        .await
    }

    async fn release_everywhere(&self, keys: &Keys, token: &LeaseToken) -> Vec<Vote<bool>> {
        self.everywhere("release", |mut conn| async move {
            ops::release(&mut conn, keys, token).await
        })
        .await
    }

    /// The validity left of a majority vote started at `start`, if any.
    fn validity(ttl: Duration, start: Instant) -> Option<Duration> {
        Some(lock_core::local_deadline(start, ttl).saturating_duration_since(Instant::now()))
            .filter(|v| !v.is_zero())
    }

    /// One round of Redlock: asks every server, keeps the lock if a majority granted it within
    /// its validity, else undoes the round everywhere. A majority that cannot be reached once
    /// the budget is spent is `Unavailable` rather than a `Timeout`.
    async fn vote(
        &self,
        request: &AcquireRequest,
        keys: &Keys,
        token: &LeaseToken,
    ) -> Result<Attempt, LockError> {
        let (name, ttl) = (request.name(), request.ttl());
        let start = Instant::now();
        let votes = self
            .everywhere("acquire", |mut conn| async move {
                // Redlock does not queue: its votes are separate servers' answers.
                ops::try_acquire(&mut conn, name, keys, token, ttl, Mark::No, Duration::ZERO).await
            })
            .await;
        let mut granted = Vec::new();
        let mut holder_left: Option<Duration> = None;
        let mut foreign = None;
        let mut failed = 0;
        for (node, vote) in self.inner.nodes.iter().zip(votes) {
            match vote {
                Ok(Try::Granted { fence, server_ms }) => granted.push((node, fence, server_ms)),
                // Only a waiter of a single-server backend on the same keys could have queued.
                Ok(Try::Queued { turn }) => {
                    holder_left = Some(holder_left.map_or(turn, |left| left.min(turn)));
                }
                Ok(Try::Busy { pttl }) => {
                    holder_left = match (holder_left, pttl) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Err(error @ LockError::Foreign { .. }) => foreign = Some(error),
                Err(_) => failed += 1,
            }
        }
        if foreign.is_none()
            && granted.len() >= self.quorum()
            && Self::validity(ttl, start).is_some()
        {
            let fence = granted.iter().map(|(_, f, _)| *f).max().unwrap_or_default();
            let server_ms = granted.iter().map(|(_, _, t)| *t).max().unwrap_or_default();
            // The fence goes back to the granting majority before the grant is returned: the
            // next majority shares a server with it, so its fence is higher.
            let raised = self
                .on(
                    granted.iter().map(|(node, ..)| *node),
                    "raise the fence",
                    |mut conn| async move { ops::raise_fence(&mut conn, name, keys, fence).await },
                )
                .await;
            let mut written = 0;
            for vote in raised {
                match vote {
                    Ok(()) => written += 1,
                    Err(error @ LockError::Foreign { .. }) => foreign = Some(error),
                    Err(_) => {}
                }
            }
            // Checked again after the write-back: a grant past its local deadline is no grant.
            if foreign.is_none() && written >= self.quorum() && Self::validity(ttl, start).is_some()
            {
                return Ok(Attempt::Acquired(Grant::new(
                    ops::lease(name, token, fence, ttl, server_ms),
                    start,
                )));
            }
        }
        if !granted.is_empty() || failed > 0 {
            self.release_everywhere(keys, token).await;
        }
        if let Some(error) = foreign {
            return Err(error);
        }
        let nodes = self.inner.nodes.len();
        if failed > nodes - self.quorum() && Instant::now() >= request.deadline() {
            return Err(LockError::Unavailable {
                message: format!(
                    "lock `{name}`: {failed} of {nodes} servers failed to answer; a majority of {} is needed",
                    self.quorum()
                ),
                source: None,
            });
        }
        Ok(Attempt::Busy {
            expires_in: holder_left,
        })
    }

    /// Judges a renewal vote: granted by a majority in time, else not held or unavailable.
    fn judge_renewal(
        &self,
        lease: &Lease,
        ttl: Duration,
        start: Instant,
        votes: Vec<Vote<Option<u64>>>,
    ) -> Result<Grant, LockError> {
        let renewed: Vec<u64> = votes
            .iter()
            .filter_map(|v| v.as_ref().ok().copied().flatten())
            .collect();
        let refused = votes.iter().filter(|v| matches!(v, Ok(None))).count();
        if renewed.len() >= self.quorum() && Self::validity(ttl, start).is_some() {
            let server_ms = renewed.iter().copied().max().unwrap_or_else(ops::now_ms);
            return Ok(Grant::new(ops::renewed(lease, ttl, server_ms), start));
        }
        if refused > self.inner.nodes.len() - self.quorum() {
            return Err(LockError::not_held(lease.name()));
        }
        Err(LockError::Unavailable {
            message: format!(
                "renewal of `{}` reached {} of {} servers; {} needed",
                lease.name(),
                renewed.len(),
                self.inner.nodes.len(),
                self.quorum()
            ),
            source: None,
        })
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            Fencing::BestEffort,
            Expiry::Ttl,
            Wakeup::Poll,
            WaitOrder::None,
            Clock::Client,
        )
        .with_portable_lease(true)
        .with_failover(Failover::Quorum)
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        let keys = self.keys(request.name());
        let token = LeaseToken::random();
        poll_until_acquired(request, || self.vote(request, &keys, &token)).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        lock_core::validate_ttl(ttl)?;
        let keys = self.keys(lease.name());
        let start = Instant::now();
        let votes = self
            .everywhere("renew", |mut conn| {
                let keys = &keys;
                async move { ops::renew(&mut conn, keys, lease.token(), ttl).await }
            })
            .await;
        self.judge_renewal(lease, ttl, start, votes)
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Grant, LockError>> {
        let batch: Vec<_> = leases
            .iter()
            .map(|l| (self.keys(l.name()), l.token(), l.ttl()))
            .collect();
        let start = Instant::now();
        let batch = &batch;
        let per_node: Vec<Vote<Vec<Value>>> = self
            .everywhere("batched renew", |mut conn| async move {
                ops::renew_batch(&mut conn, batch).await
            })
            .await;
        leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let votes = per_node
                    .iter()
                    .map(|node| match node {
                        Ok(replies) => Ok(replies.get(i).and_then(ops::renewed_at)),
                        Err(e) => Err(e.duplicate()),
                    })
                    .collect();
                self.judge_renewal(lease, lease.ttl(), start, votes)
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let votes = self
            .release_everywhere(&self.keys(lease.name()), lease.token())
            .await;
        if votes.iter().any(|v| matches!(v, Ok(true))) {
            return Ok(());
        }
        if votes.iter().all(Result::is_ok) {
            return Err(LockError::not_held(lease.name()));
        }
        Err(LockError::Unavailable {
            message: format!("release of `{}` could not reach every server", lease.name()),
            source: None,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        let keys = self.keys(name);
        let votes = self
            .everywhere("inspect", |mut conn| {
                let keys = &keys;
                async move { ops::inspect(&mut conn, name, keys).await }
            })
            .await;
        let mut infos: Vec<LockInfo> = Vec::new();
        for vote in votes {
            match vote {
                Ok(Some(info)) => infos.push(info),
                Err(error @ LockError::Foreign { .. }) => return Err(error),
                _ => {}
            }
        }
        let majority = infos.iter().find(|candidate| {
            infos.iter().filter(|i| i.token == candidate.token).count() >= self.quorum()
        });
        Ok(majority.map(|m| {
            let same: Vec<_> = infos.iter().filter(|i| i.token == m.token).collect();
            let fence = same.iter().map(|i| i.fence).max().unwrap_or(m.fence);
            let left = same.iter().filter_map(|i| i.expires_in).min();
            LockInfo::new(name.clone(), m.token.clone(), fence, left)
        }))
    }
}
