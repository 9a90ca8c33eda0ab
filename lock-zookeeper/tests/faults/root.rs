//! A lock root that does not exist yet: created, one node per segment, every create counted.

use std::time::Duration;

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{err, unique_name},
};
use lock_core::LockOptions;
use lock_zookeeper::ZkConfig;

use super::{
    client,
    support::{STANDALONE_VAR, hosts, raw_client},
};

/// A two-segment root that does not exist: the backend creates it, sending (and counting)
/// six creates, and makes nothing else under the root's top node.
pub(crate) async fn missing_root() -> Outcome {
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let top = format!("/faults-root-{:016x}", rand::random::<u64>());
    let root = format!("{top}/locks");
    let config = ZkConfig::new(hosts.clone())
        .session_timeout(Duration::from_secs(4))
        .root(root.clone());
    let (client, backend) = client(&config).await?;
    let name = unique_name("missing-root")?;
    let before = backend.operations();
    let guard = client
        .lock_with(&name, &LockOptions::new())
        .await
        .map_err(err)?;
    let spent = backend.operations();
    // The contender and the container (both answered NoNode), each segment of the root, the
    // container, the contender: six creates sent, six counted.
    ensure!(
        spent.creates - before.creates == 6,
        "{} creates counted for a two-segment missing root ({before:?} -> {spent:?}); expected 6",
        spent.creates - before.creates
    );
    guard.release().await.map_err(err)?;
    let admin = raw_client(&hosts, Duration::from_secs(4))
        .await
        .map_err(Failure)?;
    let made = admin.list_children(&top).await.map_err(err)?;
    ensure!(
        made == ["locks"],
        "the root's top node has {made:?}, expected only `locks`"
    );
    // Clean-up, deepest first (the empty container may already be gone).
    for path in [config.lock_path(&name), root, top] {
        match admin.delete(&path, None).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            Err(e) => return Err(Failure(format!("deleting {path}: {e}"))),
        }
    }
    Ok(())
}
