//! [`LockAdmin`] for ZooKeeper: the locks are the children of the root (each a container of
//! contender nodes, the lowest one holding); a forced release deletes the holder's node, so
//! the next contender holds at once and the evicted holder's next renewal finds its node gone
//! (its `lost()` fires then).
//!
//! **The fence floor** is the evicted holder's fence plus one. Fences are creation zxids of
//! contender nodes, and the waiters' nodes, made before the eviction, have lower zxids than
//! anything written by it: a floor taken from the store's clock would be above the next
//! holder's fence. Every contender after the evicted holder has a higher zxid, so the next
//! holder's fence is at or above this floor.

use lock_core::{
    Fence, Forced, HeldLock, LockAdmin, LockError, LockInfo, LockName, backend::async_trait,
};
use zookeeper_client as zk;

use crate::{ZkBackend, encoding::decode_segment, error::ZkError, recipe, session::Conn};

/// How many contenders wait behind the holder of `lock_path`.
async fn waiters(conn: &Conn, lock_path: &str) -> Option<u64> {
    let children = conn.list(lock_path).await.ok()?;
    u64::try_from(children.len().saturating_sub(1)).ok()
}

fn held(info: &LockInfo, waiters: Option<u64>) -> HeldLock {
    HeldLock::new(info.name.clone(), &info.token, info.fence, None, waiters)
}

#[async_trait]
impl LockAdmin for ZkBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>, LockError> {
        self.on_server(async {
            let conn = self.live().await?;
            let root = self.config().root.clone();
            let children = match conn.list(&root).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(Vec::new()),
                Err(e) => return Err(ZkError::new("list", &root, e).into()),
            };
            let mut names: Vec<LockName> = children
                .iter()
                .filter_map(|segment| decode_segment(segment))
                .filter(|name| name.as_str().starts_with(prefix))
                .collect();
            names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            let mut held_locks = Vec::new();
            for name in names {
                let path = self.lock_path(&name);
                if let Some(info) = recipe::inspect(&conn, &path, &name).await? {
                    held_locks.push(held(&info, waiters(&conn, &path).await));
                }
            }
            Ok(held_locks)
        })
        .await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Forced>, LockError> {
        self.on_server(async {
            let conn = self.live().await?;
            let lock_path = self.lock_path(name);
            let Some(info) = recipe::inspect(&conn, &lock_path, name).await? else {
                return Ok(None);
            };
            let evicted = held(&info, waiters(&conn, &lock_path).await);
            // The token is `<node name>/<secret>` (or the node name, for a foreign contender).
            let node = info.token.as_str().split('/').next().unwrap_or_default();
            let path = format!("{lock_path}/{node}");
            match recipe::delete(&conn, &path).await {
                // Gone already (released, or its session ended): nothing was forced.
                Ok(false) => Ok(None),
                Ok(true) => Ok(Some(Forced::new(evicted, Fence::new(info.fence.get() + 1)))),
                Err(e) => Err(ZkError::new("delete", &path, e).into()),
            }
        })
        .await
    }
}
