//! The row lock's raw floors: InnoDB's own queue (raw connections taking one row in turn with
//! `SELECT ... FOR UPDATE`, plain, or with the one step of the row lock's that needs a durable
//! commit per grant: a fence bump on a second connection, see [`Fence`]), and one client's
//! uncontended cycle by hand with that bump ([`FencedCycle`]).

use std::{
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use lock_mysql::MySqlBackend;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection};
use tokio::sync::Mutex;

/// Whether each grant of the raw queue issues a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Only the row lock: `START TRANSACTION`, `SELECT ... FOR UPDATE`, hold, `ROLLBACK`.
    None,
    /// After each grant, before the hold, the row lock's fence bump (an autocommitted
    /// `INSERT ... ON DUPLICATE KEY UPDATE` of the name's row of `<table>_fences`) on a second
    /// connection of the same client: the durable commit per acquisition that fences which
    /// survive the holder's rollback cost.
    Bumped,
}

/// `clients` OS threads, each with its own runtime and raw connection (two with
/// [`Fence::Bumped`]), take one row of the backend's table in turn for `run_for`, each
/// holding it `hold`. Returns acquisitions per second.
pub(crate) fn raw_row_queue(
    url: &str,
    backend: &MySqlBackend,
    (clients, fence): (usize, Fence),
    hold: Duration,
    run_for: Duration,
) -> Result<f64, String> {
    let table = backend.table().as_str().to_owned();
    let name = format!("bench/raw-queue/{:016x}", rand::random::<u64>()).into_bytes();
    let ready = Arc::new(Barrier::new(clients + 1));
    let mut threads = Vec::with_capacity(clients);
    for index in 0..clients {
        let client = Client {
            url: url.to_owned(),
            table: table.clone(),
            name: name.clone(),
            first: index == 0,
            fence,
        };
        let ready = ready.clone();
        threads.push(std::thread::spawn(move || -> Result<usize, String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(client.run(&ready, hold, run_for))
        }));
    }
    ready.wait();
    let mut total = 0;
    for thread in threads {
        total += thread
            .join()
            .map_err(|_| "a raw queue client panicked".to_owned())??;
    }
    Ok(total as f64 / run_for.as_secs_f64())
}

/// One client of the raw queue.
struct Client {
    url: String,
    table: String,
    name: Vec<u8>,
    /// The first creates the row.
    first: bool,
    fence: Fence,
}

impl Client {
    /// Connects, waits for every client at `ready`, then takes the row in turn until
    /// `run_for` has passed. Returns how many times it took the row in that time.
    async fn run(
        self,
        ready: &Barrier,
        hold: Duration,
        run_for: Duration,
    ) -> Result<usize, String> {
        let connected = self.connect().await;
        let (mut conn, mut bumps) = match connected {
            Ok(conns) => conns,
            Err(error) => {
                ready.wait();
                return Err(error);
            }
        };
        ready.wait();
        let end = Instant::now() + run_for;
        let lock = format!(
            "SELECT name FROM `{}` WHERE name = ? FOR UPDATE",
            self.table
        );
        let bump = format!(
            "INSERT INTO `{}_fences` (name, fence) VALUES (?, LAST_INSERT_ID(1)) \
             ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)",
            self.table
        );
        let mut taken = 0;
        while Instant::now() < end {
            sqlx::raw_sql("START TRANSACTION")
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::query(AssertSqlSafe(lock.clone()))
                .bind(&self.name)
                .fetch_all(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(bumps) = bumps.as_mut() {
                sqlx::query(AssertSqlSafe(bump.clone()))
                    .bind(&self.name)
                    .execute(bumps)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            if Instant::now() < end {
                taken += 1;
            }
            tokio::time::sleep(hold).await;
            sqlx::raw_sql("ROLLBACK")
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(taken)
    }

    /// The client's connection (the first creates the row on it) and, with
    /// [`Fence::Bumped`], the one its bumps run on.
    async fn connect(&self) -> Result<(MySqlConnection, Option<MySqlConnection>), String> {
        let mut conn = MySqlConnection::connect(&self.url)
            .await
            .map_err(|e| e.to_string())?;
        if self.first {
            let create = format!("INSERT IGNORE INTO `{}` (name) VALUES (?)", self.table);
            sqlx::query(AssertSqlSafe(create))
                .bind(&self.name)
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        let bumps = match self.fence {
            Fence::None => None,
            Fence::Bumped => Some(
                MySqlConnection::connect(&self.url)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
        };
        Ok((conn, bumps))
    }
}

/// The row lock's uncontended cycle by hand, on two connections of its own: `START
/// TRANSACTION` and `SELECT ... FOR UPDATE` of a row in one round trip, the fence bump (as
/// [`Fence::Bumped`]) on the second connection, `ROLLBACK`. What the library adds to this is
/// the record of the hold, the parked statement that watches the hold's connection (stopped
/// with `KILL QUERY` from another connection before the release) and its tasks.
pub(crate) struct FencedCycle {
    /// The connection the row is locked on, and the one the bump runs on.
    conns: Mutex<(MySqlConnection, MySqlConnection)>,
    lock: String,
    bump: String,
    name: Vec<u8>,
}

impl FencedCycle {
    /// Connects twice to `url` and creates a row of its own in the backend's table.
    pub(crate) async fn new(url: &str, backend: &MySqlBackend) -> Result<Self, String> {
        let table = backend.table().as_str();
        let name = format!("bench/fenced/{:016x}", rand::random::<u64>());
        let mut conn = MySqlConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let bumps = MySqlConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let create = format!("INSERT IGNORE INTO `{table}` (name) VALUES (?)");
        sqlx::query(AssertSqlSafe(create))
            .bind(name.as_bytes())
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        // Literal in the text batch (a bench name of hex digits), so it goes in one round trip.
        Ok(Self {
            conns: Mutex::new((conn, bumps)),
            lock: format!(
                "START TRANSACTION; SELECT name FROM `{table}` WHERE name = '{name}' FOR UPDATE"
            ),
            bump: format!(
                "INSERT INTO `{table}_fences` (name, fence) VALUES (?, LAST_INSERT_ID(1)) \
                 ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)"
            ),
            name: name.into_bytes(),
        })
    }

    /// One cycle.
    pub(crate) async fn cycle(&self) -> Result<(), String> {
        let mut conns = self.conns.lock().await;
        let (conn, bumps) = &mut *conns;
        sqlx::raw_sql(AssertSqlSafe(self.lock.clone()))
            .execute(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query(AssertSqlSafe(self.bump.clone()))
            .bind(&self.name)
            .execute(&mut *bumps)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}
