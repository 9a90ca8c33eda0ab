//! The row lock's raw floors: InnoDB's own queue (raw connections taking one row in turn with
//! `SELECT ... FOR UPDATE`, plain, or with the one step of the row lock's that needs a durable
//! commit per grant: a fence bump on a second connection, see [`Fence`]), and one client's
//! bare uncontended cycle by hand, without and with that bump ([`BareCycle`]).

use std::time::{Duration, Instant};

use conformance_tests::bench;
use lock_mysql::MySqlBackend;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection};
use tokio::sync::Mutex;

/// Whether each grant of a raw floor issues a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Only the row lock: `START TRANSACTION`, `SELECT ... FOR UPDATE`, (hold,) `ROLLBACK`.
    None,
    /// After each grant, before the hold, the row lock's fence bump (an autocommitted
    /// `INSERT ... ON DUPLICATE KEY UPDATE` of the name's row of `<table>_fences`) on a second
    /// connection of the same client: the durable commit per acquisition that fences which
    /// survive the holder's rollback cost.
    Bumped,
}

/// The row lock's fence bump on `table`'s fence table (one `?`: the name).
fn bump_sql(table: &str) -> String {
    format!(
        "INSERT INTO `{table}_fences` (name, fence) VALUES (?, LAST_INSERT_ID(1)) \
         ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)"
    )
}

/// `clients` separate clients (each an OS thread with its own runtime and raw connection, two
/// with [`Fence::Bumped`]; see [`bench::run_counting`]) take one row of the backend's table in
/// turn for `run_for`, each holding it `hold`. Returns the acquisitions begun within `run_for`
/// per second of `run_for`. (A fleet divides its count by the whole run, to the end of its
/// last turns, about 1 % longer here: its rate against this one leans, if at all, against
/// this library.)
pub(crate) fn raw_row_queue(
    url: &str,
    backend: &MySqlBackend,
    (clients, fence): (usize, Fence),
    hold: Duration,
    run_for: Duration,
) -> Result<f64, String> {
    let (url, table) = (url.to_owned(), backend.table().as_str().to_owned());
    let name = format!("bench/raw-queue/{:016x}", rand::random::<u64>()).into_bytes();
    let taken = bench::run_counting(
        clients,
        move |id| {
            let client = Client {
                url: url.clone(),
                table: table.clone(),
                name: name.clone(),
                first: id == 0,
                fence,
            };
            async move { client.connect().await.map(|conns| (client, conns)) }
        },
        move |_, (client, conns), began| async move { client.run(conns, hold, began + run_for).await },
    )?;
    // Per second of `run_for`: raw waiters still in the queue at its end are served after it
    // (a fleet's stop waiting then), so the whole run's length would understate the floor.
    Ok(taken as f64 / run_for.as_secs_f64())
}

/// One client of the raw queue.
struct Client {
    /// The server's URL.
    url: String,
    /// The backend's table, whose row the clients lock (and whose fence table they bump).
    table: String,
    /// The row's name.
    name: Vec<u8>,
    /// The first creates the row.
    first: bool,
    /// Whether each grant bumps the fence.
    fence: Fence,
}

impl Client {
    /// Takes the row in turn on `conns` (see [`Client::connect`]) until `end`. Returns how many
    /// times it took the row before `end`.
    async fn run(
        &self,
        (mut conn, mut bumps): (MySqlConnection, Option<MySqlConnection>),
        hold: Duration,
        end: Instant,
    ) -> Result<usize, String> {
        let lock = format!(
            "SELECT name FROM `{}` WHERE name = ? FOR UPDATE",
            self.table
        );
        let bump = bump_sql(&self.table);
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
        let row = self
            .first
            .then_some((self.table.as_str(), self.name.as_slice()));
        connections(&self.url, row, self.fence).await
    }
}

/// A connection to `url` (creating `row`, a name in a table, on it when given) and, with
/// [`Fence::Bumped`], a second one for the bumps.
async fn connections(
    url: &str,
    row: Option<(&str, &[u8])>,
    fence: Fence,
) -> Result<(MySqlConnection, Option<MySqlConnection>), String> {
    let mut conn = MySqlConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    if let Some((table, name)) = row {
        let create = format!("INSERT IGNORE INTO `{table}` (name) VALUES (?)");
        sqlx::query(AssertSqlSafe(create))
            .bind(name)
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    let bumps = match fence {
        Fence::None => None,
        Fence::Bumped => Some(
            MySqlConnection::connect(url)
                .await
                .map_err(|e| e.to_string())?,
        ),
    };
    Ok((conn, bumps))
}

/// A bare row-lock cycle by hand, on connections of its own: `START TRANSACTION` and `SELECT
/// ... FOR UPDATE` of a row in one round trip, with [`Fence::Bumped`] the fence bump on a second
/// connection, then `ROLLBACK`. Not the library's cycle: that one also reads the fence counter
/// and looks for a committed record as it is granted, writes the hold's record beside the
/// bump, parks a statement that watches the hold's connection and stops it with `KILL QUERY`
/// from another connection before the release, and runs in tasks of its own.
pub(crate) struct BareCycle {
    /// The connection the row is locked on, and with [`Fence::Bumped`] the one the bump runs
    /// on.
    conns: Mutex<(MySqlConnection, Option<MySqlConnection>)>,
    /// The batch that locks the row.
    lock: String,
    /// The fence bump.
    bump: String,
    /// The row's name.
    name: Vec<u8>,
}

impl BareCycle {
    /// Connects to `url` (twice with [`Fence::Bumped`]) and creates a row of its own in the
    /// backend's table.
    pub(crate) async fn new(
        url: &str,
        backend: &MySqlBackend,
        fence: Fence,
    ) -> Result<Self, String> {
        let table = backend.table().as_str();
        let name = format!("bench/bare/{:016x}", rand::random::<u64>());
        let (conn, bumps) = connections(url, Some((table, name.as_bytes())), fence).await?;
        // The name (ASCII letters, a slash and hex digits) is a literal in the text batch, so
        // the batch goes in one round trip.
        Ok(Self {
            conns: Mutex::new((conn, bumps)),
            lock: format!(
                "START TRANSACTION; SELECT name FROM `{table}` WHERE name = '{name}' FOR UPDATE"
            ),
            bump: bump_sql(table),
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
        if let Some(bumps) = bumps.as_mut() {
            sqlx::query(AssertSqlSafe(self.bump.clone()))
                .bind(&self.name)
                .execute(bumps)
                .await
                .map_err(|e| e.to_string())?;
        }
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}
