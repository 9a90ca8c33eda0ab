//! The faults a campaign does to a store's servers, per store (see [`begin`]).

use std::time::Duration;

use conformance_tests::faults::{Instance, Paused, Stopped, signal};
use rand::{Rng, rngs::StdRng};
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, Row};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{Fault, clock, stores};

fn failure(f: conformance_tests::Failure) -> String {
    f.0
}

/// A store fault in progress: end it with [`Down::end`] after [`Down::lasts`].
#[derive(Debug)]
pub struct Down {
    what: String,
    outage: bool,
    from: crate::Nanos,
    lasts: Duration,
    undo: Undo,
}

/// How a fault is undone.
#[derive(Debug)]
enum Undo {
    Start(Stopped),
    Resume(Paused),
    Nothing,
}

/// Begins one fault of `store`'s servers, meant to last about `ttl` (longer where the fault
/// needs it):
///
/// - redis, the cluster: every server stopped (no persistence: the locks are gone), then
///   started;
/// - Redlock: two of five servers stopped (a majority left), or three (none left);
/// - MariaDB: the server killed (`SIGKILL`, a crash), then started; or `KILL CONNECTION` of
///   the row-lock holder's connection (lease, or nobody holds: of a random campaign
///   connection);
/// - ZooKeeper: the server paused (`SIGSTOP`) past the clients' session timeout;
/// - the ensemble: its leader stopped, then started.
///
/// # Errors
/// When a server's script or signal fails.
pub async fn begin(store: &str, ttl: Duration, rng: &mut StdRng) -> Result<Down, String> {
    let from = clock::now();
    let (what, outage, lasts, undo) = match store {
        "redlock" => {
            let three = rng.random_bool(0.5);
            let names: &[&str] = if three {
                &["redlock-2", "redlock-3", "redlock-4"]
            } else {
                &["redlock-3", "redlock-4"]
            };
            let down = Stopped::instances(names).await.map_err(failure)?;
            let what = format!("restart {}", names.join(","));
            (what, three, ttl, Undo::Start(down))
        }
        "mysql-lease" | "mysql-rowlock" if rng.random_bool(0.5) => {
            let killed = kill_connection(store, rng).await?;
            let what = format!("kill-connection {killed}");
            (what, false, Duration::ZERO, Undo::Nothing)
        }
        "mysql-lease" | "mysql-rowlock" => {
            let mariadb = Instance::named("mariadb").map_err(failure)?;
            signal(mariadb.pid().map_err(failure)?, "KILL").map_err(failure)?;
            // The stop script waits until the killed process is gone; its guard starts the
            // server again, even if this campaign fails first.
            let down = Stopped::instances(&["mariadb"]).await.map_err(failure)?;
            let what = "crash mariadb (SIGKILL), then start".to_owned();
            (what, true, ttl, Undo::Start(down))
        }
        "zookeeper" => {
            let zookeeper = Instance::named("zookeeper").map_err(failure)?;
            let paused = zookeeper.pause().map_err(failure)?;
            let lasts = stores::ZK_SESSION + Duration::from_secs(1);
            let what = "pause zookeeper past the session timeout".to_owned();
            (what, true, lasts, Undo::Resume(paused))
        }
        "zk-ensemble" => {
            let leader = ensemble_leader().await?;
            let down = Stopped::instances(&[leader.as_str()])
                .await
                .map_err(failure)?;
            let what = format!("restart {leader} (the leader)");
            (what, true, ttl, Undo::Start(down))
        }
        "redis" | "redis-cluster" => {
            let down = Stopped::instances(&[store]).await.map_err(failure)?;
            (format!("restart {store}"), true, ttl, Undo::Start(down))
        }
        other => return Err(format!("no store fault for `{other}`")),
    };
    Ok(Down {
        what,
        outage,
        from,
        lasts,
        undo,
    })
}

impl Down {
    /// How long the fault should last.
    pub fn lasts(&self) -> Duration {
        self.lasts
    }

    /// Undoes the fault (starts or continues the servers); what it was.
    ///
    /// # Errors
    /// When a server's script or signal fails.
    pub async fn end(self) -> Result<Fault, String> {
        match self.undo {
            Undo::Start(down) => down.start().await.map_err(failure)?,
            Undo::Resume(paused) => paused.resume().map_err(failure)?,
            Undo::Nothing => {}
        }
        Ok(Fault {
            what: self.what,
            from: self.from,
            to: clock::now(),
            outage: self.outage,
        })
    }
}

/// `KILL CONNECTION` of the row-lock holder's connection, or (lease, or nobody holds) of a
/// random connection of the campaign's user; the id killed (0: none found).
async fn kill_connection(store: &str, rng: &mut StdRng) -> Result<u64, String> {
    let url = std::env::var("LOCK_TEST_MYSQL_URL")
        .map_err(|_| "LOCK_TEST_MYSQL_URL is not set".to_owned())?;
    let mut admin = MySqlConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let mut target = None;
    if store == "mysql-rowlock" {
        let sql = format!(
            "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION READ ONLY; \
             SELECT connection_id FROM `{}_holds` LIMIT 1; COMMIT",
            stores::mysql_table(store)
        );
        let rows = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut admin)
            .await
            .map_err(|e| e.to_string())?;
        target = rows
            .first()
            .and_then(|row| row.try_get::<Option<u64>, _>(0).ok().flatten());
    }
    if target.is_none() {
        // `PROCESSLIST.ID` is a signed BIGINT on MariaDB.
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT ID FROM information_schema.PROCESSLIST \
             WHERE USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1) AND ID <> CONNECTION_ID()",
        )
        .fetch_all(&mut admin)
        .await
        .map_err(|e| e.to_string())?;
        let pick = (!ids.is_empty()).then(|| ids[rng.random_range(0..ids.len())]);
        target = pick.and_then(|id| u64::try_from(id).ok());
    }
    if let Some(id) = target {
        // The connection may be gone by now: that is no failure of the campaign.
        let _ = sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .execute(&mut admin)
            .await;
    }
    let _ = admin.close().await;
    Ok(target.unwrap_or(0))
}

/// The instance name (`zk-ensemble-<n>`) of the ensemble's leader, asked with `srvr`.
async fn ensemble_leader() -> Result<String, String> {
    let hosts = std::env::var("LOCK_TEST_ZK_ENSEMBLE")
        .map_err(|_| "LOCK_TEST_ZK_ENSEMBLE is not set".to_owned())?;
    for (i, host) in hosts.split(',').enumerate() {
        let Ok(mut stream) = tokio::net::TcpStream::connect(host).await else {
            continue;
        };
        if stream.write_all(b"srvr").await.is_err() {
            continue;
        }
        let mut answer = String::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut answer)).await;
        if answer.contains("Mode: leader") {
            return Ok(format!("zk-ensemble-{}", i + 1));
        }
    }
    Err("no ensemble server says it leads".into())
}
