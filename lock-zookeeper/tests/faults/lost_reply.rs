//! A create whose reply is lost: a relay cuts the connection after the server applied the
//! contender's `create` and before its reply reached the client.

use std::{net::SocketAddr, time::Duration};

use conformance_tests::{
    Failure, Outcome, ensure,
    faults::{Relay, err, unique_name},
};
use lock_core::{LockGuard, LockOptions};
use lock_zookeeper::ZkConfig;

use super::{
    client,
    frames::CreateReplyCutter,
    support::{STANDALONE_VAR, ZkStore, hosts},
};

/// The contender finds its node again by UUID instead of creating a second one, on the same
/// session.
pub(crate) async fn lost_create_reply() -> Outcome {
    let hosts = hosts(STANDALONE_VAR).map_err(Failure)?;
    let upstream: SocketAddr = hosts
        .split(',')
        .next()
        .and_then(|h| h.trim().parse().ok())
        .ok_or_else(|| Failure(format!("{STANDALONE_VAR}={hosts} is not one `ip:port`")))?;
    let cutter = CreateReplyCutter::default();
    let relay = Relay::with_hook(upstream, {
        let cutter = cutter.clone();
        move || cutter.hook()
    })
    .await?;
    let store = ZkStore::from_env(STANDALONE_VAR, Duration::from_secs(4))
        .await
        .map_err(Failure)?;
    let name = unique_name("lost-reply")?;
    // The lock node exists, so the contender's create is the first create2 and succeeds.
    store.ensure_lock_node(&name).await.map_err(err)?;
    let config = ZkConfig::new(relay.addr().to_string()).session_timeout(Duration::from_secs(4));
    let (client, backend) = client(&config).await?;
    let session = backend.session_id();
    let before = backend.operations();
    cutter.arm();
    let guard: LockGuard = client
        .lock_with(&name, &LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .map_err(|e| Failure(format!("acquire after a lost create reply: {e}")))?;
    let spent = backend.operations();
    ensure!(cutter.cuts() == 1, "the proxy did not cut a create's reply");
    ensure!(
        backend.session_id() == session,
        "the session changed: this tested reconnection, not a lost reply"
    );
    ensure!(
        spent.creates - before.creates == 1,
        "{} creates: the contender created a second node instead of finding its own",
        spent.creates - before.creates
    );
    let children = store.children(&name).await.map_err(err)?;
    let token = guard.lease().token().as_str().to_owned();
    ensure!(
        children.len() == 1 && token.starts_with(&format!("{}/", children[0])),
        "after the lost reply the lock node has {children:?}; expected only our node"
    );
    guard.release().await.map_err(err)?;
    ensure!(
        store.children(&name).await.map_err(err)?.is_empty(),
        "nodes left after release"
    );
    println!(
        "        create reply dropped by the proxy; node found again by its UUID ({:?} -> {spent:?})",
        before
    );
    Ok(())
}
