//! Curator's layout, both ways: contender nodes written by Curator's rules are respected by
//! this crate, and this crate's nodes are what Curator's algorithm expects.

use std::time::{Duration, Instant};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, poll_until, unique_name},
};
use lock_core::{LockClient, LockOptions};
use lock_zookeeper::ZkBackend;
use zookeeper_client::{Acls, Client, CreateMode};

use super::support::{STANDALONE_VAR, ZkStore, hosts, raw_client};

/// Curator's `StandardLockInternalsDriver`: sort by the text after `lock-`, hold when first,
/// else watch the one before. Returns the node to watch, or `None` when `ours` holds.
fn curator_decides(children: &[String], ours: &str) -> Result<Option<String>, Failure> {
    let key = |c: &str| c.split_once("lock-").map(|(_, s)| s.to_owned());
    let mut sorted: Vec<_> = children.to_vec();
    sorted.sort_by_key(|c| key(c));
    let at = sorted
        .iter()
        .position(|c| c == ours)
        .ok_or_else(|| Failure(format!("Curator's node {ours} is not among {children:?}")))?;
    Ok(at.checked_sub(1).map(|i| sorted[i].clone()))
}

async fn curator_create(curator: &Client, path: &str) -> Result<(String, i64), Failure> {
    let uuid = uuid::Uuid::new_v4();
    let prefix = format!("{path}/_c_{uuid}-lock-");
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (stat, sequence) = curator
        .create(&prefix, b"127.0.0.1", &options)
        .await
        .map_err(err)?;
    Ok((format!("_c_{uuid}-lock-{sequence}"), stat.czxid))
}

/// Contender nodes in Curator's layout, written by a raw client, and this crate's, in one
/// queue: each side waits for the other by its own rules.
pub(crate) async fn curator_interop() -> Outcome {
    let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(4))
        .await
        .map_err(Failure)?;
    let backend = store.backend().await?;
    let ours = LockClient::new(backend.clone());
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let curator = raw_client(&hosts, Duration::from_secs(4))
        .await
        .map_err(Failure)?;
    let wake = ours_waits_behind_curator(&store, &backend, &curator).await?;
    curator_waits_behind_ours(&store, &ours, &curator).await?;
    println!(
        "        waited behind a Curator contender (woke {wake:?} after its delete); Curator's rules queue behind ours"
    );
    Ok(())
}

/// Ours waits behind a lower Curator contender, watching it, and gets the lock with a higher
/// fence once it is deleted; how long after the delete.
async fn ours_waits_behind_curator(
    store: &ZkStore,
    backend: &ZkBackend,
    curator: &Client,
) -> Result<Duration, Failure> {
    let ours = LockClient::new(backend.clone());
    let name = unique_name("curator-first")?;
    let path = store.ensure_lock_node(&name).await.map_err(err)?;
    let (theirs, czxid) = curator_create(curator, &path).await?;
    let try_now = ours
        .try_lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    ensure!(
        try_now.is_none(),
        "we took a lock held by a Curator contender"
    );
    let info = ours
        .inspect(&name)
        .await
        .map_err(err)?
        .ok_or_else(|| Failure("inspect shows the Curator-held lock as free".into()))?;
    ensure!(
        info.token.as_str() == theirs && info.fence.get() == czxid as u64,
        "inspect does not show the Curator contender"
    );
    let watches = backend.operations().watches;
    let waiting = tokio::spawn({
        let (ours, name) = (ours.clone(), name.clone());
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(20));
            let guard = ours.lock_with(&name, &options).await;
            (Instant::now(), guard)
        }
    });
    poll_until(
        Duration::from_secs(10),
        "our contender queueing",
        async || Ok(store.children(&name).await.map_err(err)?.len() == 2),
    )
    .await?;
    // Waiting for real: it has set its watch on the Curator contender.
    poll_until(
        Duration::from_secs(10),
        "our contender watching the Curator contender",
        async || Ok(backend.operations().watches > watches),
    )
    .await?;
    ensure!(
        !waiting.is_finished(),
        "we did not wait for the Curator contender"
    );
    let released = Instant::now();
    curator
        .delete(&format!("{path}/{theirs}"), None)
        .await
        .map_err(err)?;
    let (acquired, guard) = waiting.await.map_err(err)?;
    let guard = guard.map_err(err)?;
    ensure!(
        guard.fence().get() > czxid as u64,
        "our fence is not above the Curator contender's"
    );
    let wake = acquired - released;
    guard.release().await.map_err(err)?;
    Ok(wake)
}

/// Theirs waits behind ours, by Curator's own rules; once we release, Curator's contender
/// holds and we wait.
async fn curator_waits_behind_ours(
    store: &ZkStore,
    ours: &LockClient,
    curator: &Client,
) -> Outcome {
    let name = unique_name("ours-first")?;
    let path = store.ensure_lock_node(&name).await.map_err(err)?;
    let guard = ours
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let token = guard.lease().token().clone();
    let our_node = token
        .as_str()
        .split_once('/')
        .map(|(node, _)| node.to_owned())
        .ok_or_else(|| Failure("our token does not start with the node name".into()))?;
    // Curator's `ProtectedUtils.isProtectedZNode`: `_c_`, more than 40 characters, `-` at 39.
    ensure!(
        our_node.starts_with("_c_") && our_node.len() > 40 && our_node.as_bytes()[39] == b'-',
        "our node {our_node} is not in Curator's protected layout"
    );
    let (theirs, _) = curator_create(curator, &path).await?;
    let children = store.children(&name).await.map_err(err)?;
    let watch = curator_decides(&children, &theirs)?;
    ensure!(
        watch.as_deref() == Some(our_node.as_str()),
        "Curator's algorithm would watch {watch:?}, not our holder {our_node}"
    );
    guard.release().await.map_err(err)?;
    let children = store.children(&name).await.map_err(err)?;
    ensure!(
        curator_decides(&children, &theirs)?.is_none(),
        "after our release Curator's contender is not first: {children:?}"
    );
    // And while Curator holds, we wait.
    let busy = ours
        .try_lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    ensure!(
        busy.is_none(),
        "we took the lock Curator's contender now holds"
    );
    curator
        .delete(&format!("{path}/{theirs}"), None)
        .await
        .map_err(err)?;
    ensure!(
        store.children(&name).await.map_err(err)?.is_empty(),
        "nodes left behind"
    );
    Ok(())
}
