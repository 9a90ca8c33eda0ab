//! [`MySqlBackend`]: the [`LockBackend`] over MySQL/MariaDB, with either strategy.

use std::{sync::Arc, time::Duration};

use lock_core::{
    Capabilities, Clock, Expiry, Failover, Fencing, Lease, LockBackend, LockError, LockInfo,
    LockName, WaitOrder, Wakeup,
    backend::{AcquireRequest, Grant, async_trait},
};
use sqlx::{AssertSqlSafe, Connection, MySqlPool, mysql::MySqlPoolOptions};

use crate::{
    MySqlConfig, Strategy, TableName, anchor,
    error::Error,
    kept,
    lease::{LeaseStrategy, Limits},
    row_lock::{self, RowLockStrategy},
    schema,
    server::Server,
};

/// Locks in a MySQL or MariaDB table, with the [`Strategy`] of its [`MySqlConfig`].
///
/// One backend is one client: one sqlx pool (see [`MySqlConfig`] for how many connections it
/// needs). Cheap to clone; clones share the pool and, for the row-lock strategy, the holds.
/// Use it through [`lock_core::LockClient`].
#[derive(Clone)]
pub struct MySqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// The server's URL with its password hidden, for error messages.
    url: String,
    table: TableName,
    pool: MySqlPool,
    imp: Imp,
    /// What the fences are worth on this server (see [`Server::fencing`]).
    fencing: Fencing,
}

#[derive(Debug)]
pub(crate) enum Imp {
    Lease(LeaseStrategy),
    RowLock(RowLockStrategy),
}

impl Imp {
    fn strategy(&self) -> Strategy {
        match self {
            Self::Lease(_) => Strategy::Lease,
            Self::RowLock(_) => Strategy::RowLock,
        }
    }
}

impl MySqlBackend {
    /// Runs `work`, naming the server in a store error (see [`LockError::on_server`]).
    pub(crate) async fn on_server<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        work.await.map_err(|e| e.on_server(&self.inner.url))
    }

    /// What a backend of `strategy` declares (its [`LockBackend::capabilities`]), with the
    /// `fencing` its server's durability settings allow ([`Fencing::Strict`] when every
    /// commit is flushed).
    pub fn declared(strategy: Strategy, fencing: Fencing) -> Capabilities {
        match strategy {
            Strategy::Lease => Capabilities::new(
                fencing,
                Expiry::Ttl,
                Wakeup::Poll,
                // Waiters queue in `<table>_queue` (see `lease::queue`).
                WaitOrder::Fifo,
                Clock::Server,
            )
            .with_portable_lease(true)
            .with_failover(Failover::SingleServer),
            Strategy::RowLock => Capabilities::new(
                fencing,
                Expiry::Session,
                Wakeup::Push,
                // InnoDB's lock queue: waiters for the row are granted it in the order they
                // asked (MariaDB schedules first come, first served); a client that commits
                // and asks again goes behind them. Not declared FIFO: the order is the
                // server's scheduler's, which MySQL 8 weighs (CATS) and this suite cannot
                // check here.
                WaitOrder::Fair,
                Clock::Server,
            )
            .with_portable_lease(false)
            .with_failover(Failover::SingleServer)
            // Each hold is its own connection's transaction: renewals cannot share a trip.
            .with_batched_renewals(false),
        }
    }

    /// The strategy's implementation.
    pub(crate) fn imp(&self) -> &Imp {
        &self.inner.imp
    }

    /// Connects (verifying the server answers), creates the lock table if it is missing and
    /// allowed to, and checks its schema version and strategy.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a bad config (nothing is sent);
    /// [`LockError::Unavailable`] when the server cannot be reached within
    /// [`MySqlConfig::connect_timeout`]; [`LockError::Backend`] when the table exists in
    /// another layout, serves the other strategy, or cannot be created;
    /// [`LockError::Unsupported`] for the row-lock strategy on a server that kills idle
    /// transactions globally (Percona Server's `innodb_kill_idle_transaction` above 0).
    ///
    /// The server is read once here: on a server whose `innodb_flush_log_at_trx_commit` is
    /// not 1 (a crash may lose the last commits, fence bumps among them) the backend declares
    /// [`Fencing::BestEffort`] and logs why. Every session of the backend turns off the
    /// server's statement time limits (`max_statement_time`, `max_execution_time`) and
    /// idle-transaction timeouts where they exist; the backend bounds its statements itself.
    /// A row-lock backend on MariaDB also raises its anchor here, the user lock its holds
    /// park on (see the crate's README), on the pool's connection the schema was checked on,
    /// which may take up to `connect_timeout` plus `statement_timeout` more; if that fails it
    /// is logged and tried again later, holds park in `SLEEP` meanwhile, and `connect` still
    /// succeeds.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind but, possibly, the created table.
    pub async fn connect(config: &MySqlConfig) -> Result<Self, LockError> {
        config.validate()?;
        let table = config.table_name();
        let options = config.connect_options()?;
        let url = lock_core::backend::redact_url(&config.url);
        let server = Server::probe(&options, config.connect_timeout, &url).await?;
        if config.strategy == Strategy::RowLock {
            server.check_row_lock()?;
        }
        let (fencing, why) = server.fencing();
        if let Some(why) = why {
            tracing::warn!(server = %server.version, %url, "fences are best effort: {why}");
        }
        let setup = server.session_setup();
        let pool_setup = pool_setup(config, &setup);
        let pool = pool_options(config, pool_setup.clone())
            .connect_with(options.clone())
            .await
            .map_err(|e| {
                LockError::from(Error::new(
                    format!(
                        "connecting to {}",
                        lock_core::backend::redact_url(&config.url)
                    ),
                    e,
                ))
            })?;
        // One connection for the schema's statements (each on the pool would find the one
        // before still being pinged on its way back, and open another), which becomes the
        // row lock's anchor: a client opens no connection it does not keep using.
        let mut first = pool.acquire().await.map_err(|e| {
            LockError::from(Error::new(format!("checking the lock table `{table}`"), e))
        })?;
        schema::ensure(&mut first, &table, config.strategy, config.create_table).await?;
        let mariadb = server.mariadb;
        let anchor = anchor::Settings {
            pool: pool.clone(),
            connect: options.clone(),
            setup: pool_setup,
            connect_timeout: config.connect_timeout,
            statement_timeout: config.statement_timeout,
            mariadb,
        };
        let imp = match config.strategy {
            Strategy::Lease => Imp::Lease(LeaseStrategy::new(
                pool.clone(),
                table.clone(),
                Limits {
                    statement: config.statement_timeout,
                    lock_wait: Duration::from_secs(config.lock_wait_secs()),
                    mariadb,
                },
                anchor,
            )),
            Strategy::RowLock => Imp::RowLock(RowLockStrategy::new(
                pool.clone(),
                table.clone(),
                row_lock::Settings {
                    connect: options,
                    connect_timeout: config.connect_timeout,
                    max_idle: config.idle_hold_connections,
                    session_setup: setup,
                    statement_timeout: config.statement_timeout,
                },
                anchor,
            )),
        };
        match &imp {
            Imp::RowLock(strategy) => strategy.raise_anchor(first).await,
            Imp::Lease(_) => drop(first),
        }
        Ok(Self {
            inner: Arc::new(Inner {
                url: url.clone(),
                table,
                pool,
                imp,
                fencing,
            }),
        })
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.inner.imp.strategy()
    }

    /// The lock table (the row-lock strategy also uses `<table>_fences`).
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// The pool of short-statement connections (for monitoring, or to run statements next to
    /// the locks). Its counts leave out the one connection kept beside it and, on MariaDB, the
    /// anchor's (both taken out of it; see the crate's README, "Connections").
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }
}

/// The session setup of the pool's connections (and of the anchor's, see [`anchor::Settings`]):
/// `READ COMMITTED` (see [`pool_options`]), the lock-wait bound and the server's own setup.
fn pool_setup(config: &MySqlConfig, server_setup: &str) -> String {
    let mut setup = format!(
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         SET SESSION innodb_lock_wait_timeout = {}",
        config.lock_wait_secs()
    );
    if !server_setup.is_empty() {
        setup.push_str("; ");
        setup.push_str(server_setup);
    }
    setup
}

/// The pool's options: its connections run `setup` (see [`pool_setup`]).
fn pool_options(config: &MySqlConfig, setup: String) -> MySqlPoolOptions {
    MySqlPoolOptions::new()
        .max_connections(config.pool_size)
        .min_connections(0)
        .acquire_timeout(config.connect_timeout)
        // sqlx pings every connection it hands out by default: a round trip per operation.
        // Ping only those idle long enough for the server to have gone away meanwhile.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                // Fresher ones were pinged when they went back to the pool.
                if meta.idle_for >= kept::TRUSTED_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        // READ COMMITTED: a locking read of a missing row takes no gap lock, so two clients
        // creating rows cannot deadlock on a gap.
        .after_connect(move |conn, _| {
            let setup = setup.clone();
            Box::pin(async move {
                sqlx::raw_sql(AssertSqlSafe(setup)).execute(conn).await?;
                Ok(())
            })
        })
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Say goodbye to the server instead of dropping sockets, when a runtime is at hand.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = self.pool.clone();
            runtime.spawn(async move { pool.close().await });
        }
    }
}

impl std::fmt::Debug for MySqlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlBackend")
            .field("strategy", &self.strategy())
            .field("table", &self.inner.table)
            .field("pool_size", &self.inner.pool.size())
            .field("imp", &self.inner.imp)
            .finish()
    }
}

#[async_trait]
impl LockBackend for MySqlBackend {
    fn capabilities(&self) -> Capabilities {
        Self::declared(self.strategy(), self.inner.fencing)
    }

    fn store(&self) -> &'static str {
        match self.strategy() {
            Strategy::Lease => "mysql-lease",
            Strategy::RowLock => "mysql-rowlock",
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Grant, LockError> {
        self.on_server(async {
            match &self.inner.imp {
                Imp::Lease(s) => s.acquire(request).await,
                Imp::RowLock(s) => s.acquire(request).await,
            }
        })
        .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Grant, LockError> {
        self.on_server(async {
            match &self.inner.imp {
                Imp::Lease(s) => s.renew(lease, ttl).await,
                Imp::RowLock(s) => s.renew(lease, ttl).await,
            }
        })
        .await
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Grant, LockError>>, LockError> {
        self.on_server(async {
            match &self.inner.imp {
                Imp::Lease(s) => s.renew_many(leases).await,
                // Each hold on its own connection, all at once.
                Imp::RowLock(_) => lock_core::backend::renew_concurrently(self, leases).await,
            }
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.on_server(async {
            match &self.inner.imp {
                Imp::Lease(s) => s.release(lease).await,
                Imp::RowLock(s) => s.release(lease).await,
            }
        })
        .await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.on_server(async {
            match &self.inner.imp {
                Imp::Lease(s) => s.inspect(name).await,
                Imp::RowLock(s) => s.inspect(name).await,
            }
        })
        .await
    }
}
