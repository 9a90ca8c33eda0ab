//! Reads: who holds a lock, the fence of a contender node, what a foreign child means.

use lock_core::{Fence, LockError, LockInfo, LockName, backend::LeaseToken};
use zookeeper_client as zk;

use super::{RETRIES, contender::catch_up, retry};
use crate::{error::ZkError, node, session::Conn};

/// Who holds the lock at `lock_path`, as the leader last committed it.
pub(crate) async fn inspect(
    conn: &Conn,
    lock_path: &str,
    name: &LockName,
) -> Result<Option<LockInfo>, LockError> {
    // A follower may lag behind the leader; `sync` makes it catch up before we read.
    catch_up(conn, lock_path).await?;
    for _ in 0..RETRIES {
        let children = match retry(|| conn.list(lock_path)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(ZkError::new("list", lock_path, e).into()),
        };
        let queue = node::contenders(&children).map_err(|f| foreign_error(name, lock_path, &f))?;
        let Some(first) = queue.first() else {
            return Ok(None);
        };
        let path = format!("{lock_path}/{}", first.name);
        match retry(|| conn.read(&path)).await {
            Ok((data, stat)) => {
                let token = token_of(first.name, &data);
                let fence = fence(stat.czxid, first.name)?;
                return Ok(Some(LockInfo::new(name.clone(), token, fence, None)));
            }
            // Released between the listing and the read: look again.
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(ZkError::new("read", &path, e).into()),
        }
    }
    Err(LockError::unavailable_msg(format!(
        "`{name}` changed hands too often to be inspected; try again"
    )))
}

/// The owner token of a contender: its name, plus the 128-bit secret our nodes carry as data.
fn token_of(node_name: &str, data: &[u8]) -> LeaseToken {
    match std::str::from_utf8(data) {
        Ok(secret) if LeaseToken::is_random_format(secret) => {
            LeaseToken::from_store(format!("{node_name}/{secret}"))
        }
        // A Curator contender (its data is the client's address) or another writer's node.
        _ => LeaseToken::from_store(node_name),
    }
}

/// The fence of a contender node: its creation zxid.
pub(crate) fn fence(czxid: i64, node_name: &str) -> Result<Fence, LockError> {
    u64::try_from(czxid).map(Fence::new).map_err(|_| {
        LockError::backend_msg(format!(
            "contender `{node_name}` has a negative creation zxid {czxid}"
        ))
    })
}

pub(super) fn foreign_error(name: &LockName, lock_path: &str, foreign: &[&str]) -> LockError {
    LockError::foreign(
        name.to_string(),
        format!(
            "`{lock_path}` has children that are not lock contenders in Curator's layout `_c_<uuid>-lock-<sequence>`: {}",
            foreign.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_the_secret_of_our_nodes_only() {
        let node = "_c_6c3b1f7e-0b9e-4d5c-9d1e-2f0a8c7b6e5d-lock-0000000001";
        let secret = LeaseToken::random();
        let ours = token_of(node, secret.as_str().as_bytes());
        assert_eq!(ours.as_str(), format!("{node}/{}", secret.as_str()));
        assert_eq!(token_of(node, b"10.0.0.7").as_str(), node);
        assert_eq!(token_of(node, &[0xff, 0xfe]).as_str(), node);
    }

    #[test]
    fn negative_zxids_are_errors_not_panics() {
        assert!(matches!(fence(-1, "n"), Err(LockError::Backend { .. })));
        assert!(matches!(fence(7, "n"), Ok(f) if f.get() == 7));
    }
}
