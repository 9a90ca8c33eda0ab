//! Renewals of many leases on a Redis Cluster: pipelines, one per node and per
//! [`scripts::RENEW_MANY_CHUNK`] leases, where each renewal went as a request of its own.
//!
//! The keys of one script call must share a slot, and each lock's keys have a slot of their
//! own (its name is their hash tag), so a cluster renews one lease per call of
//! [`scripts::RENEW_MANY`]. Sent as concurrent requests on the multiplexed connection,
//! 10,000 renewals went out in 496 TCP segments per period (the renewal benchmark: 4.96 round
//! trips per 100 locks at most, where the target is 1). Here the calls are grouped by the node
//! that serves their key's slot, as `CLUSTER SLOTS` tells at the start of the batch (one more
//! request per batch), and each group goes as pipelines, each routed to the node that serves
//! its first lease's slot by the client's own slot map: 34 segments per period for the same
//! 10,000 (0.34 per 100 locks), and a period of 91 ms where it took 242.
//!
//! A node that does not know the script (restarted, flushed, new) answers each call of a
//! pipeline `NOSCRIPT` and runs none: those calls go again as one pipeline whose first call
//! carries the script's source (`EVAL`, which leaves the script cached for the `EVALSHA`s
//! after it). Before, each of them went again on its own: the first batch after a
//! `SCRIPT FLUSH` of the three nodes sent 458 segments for 2,500 leases, 19-24 now (fault case
//! `cluster_renews_across_nodes_in_one_batch`); the renewal benchmark's three periods of
//! 10,000 leases, the first right after a `SCRIPT FLUSH` of the nodes, averaged 2.85-3.05
//! segments per 100 leases and 155-168 ms a period before, 0.45-0.48 and 80-89 ms now.
//!
//! Any other error, any other reply than one number, every call of a pipeline that failed as
//! a whole, and a call answered `NOSCRIPT` again when sent the second time (its `EVAL`
//! refused or redirected), is answered `None`: the caller sends it again on its own, by the
//! ordinary renewal, which loads the script and follows redirections. When the slot map cannot be
//! read, every call is answered `None`, so every lease is renewed on its own, as before. A
//! lease whose TTL the store refuses is not sent (its own renewal then reports it).
//!
//! While slots move between nodes (resharding, a failover), a pipeline may reach a node that
//! no longer serves some of its keys: redis-rs then sends the *whole* pipeline again where the
//! redirection points (and refreshes its slot map), up to its retry limit, and a pipeline of
//! two nodes' keys can go back and forth, renewing the leases of the node it reaches each
//! time; when the retries are spent, its leases go on their own. That costs the nodes more
//! work for that batch, never a wrong answer: a renewal only extends a key that still holds
//! the lease's token, and the answers kept are those of the attempt that had no redirection.
//! (Not measured here: the test cluster's slots do not move.)

use std::{collections::HashMap, time::Duration};

use redis::{
    Value,
    cluster_async::ClusterConnection,
    cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr},
};

use lock_core::backend::LeaseToken;

use crate::{eval::unknown_script_reply, keys::RedisKeys as Keys, ops::millis, scripts};

/// Which node serves which slots: each range of slots with its master's node id (its address
/// when the reply has no id).
#[derive(Debug, PartialEq, Eq)]
struct SlotMap {
    /// `(first slot, last slot, node)`.
    ranges: Vec<(u16, u16, String)>,
}

impl SlotMap {
    /// The map the cluster answers to `CLUSTER SLOTS`; `None` when it cannot be read.
    async fn read(conn: &mut ClusterConnection) -> Option<Self> {
        let reply = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<Value>(conn)
            .await;
        match reply {
            Ok(reply) => Self::parse(&reply).or_else(|| {
                tracing::debug!("unreadable CLUSTER SLOTS reply: renewals go one by one");
                None
            }),
            Err(error) => {
                tracing::debug!(%error, "CLUSTER SLOTS failed: renewals go one by one");
                None
            }
        }
    }

    /// The map in a `CLUSTER SLOTS` reply: an array of `[first, last, [host, port, id, ...],
    /// replicas...]`. The master is named by its id; without one (servers before 4.0), by
    /// its host (empty for a NULL one, as a node unsure of its address answers) and port.
    /// `None` when the reply is not of that shape.
    fn parse(reply: &Value) -> Option<Self> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let text = |v: &Value| match v {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            Value::SimpleString(text) => Some(text.clone()),
            Value::Nil => Some(String::new()),
            _ => None,
        };
        let number = |v: &Value| match v {
            Value::Int(n) => u16::try_from(*n).ok(),
            _ => None,
        };
        let ranges = entries
            .iter()
            .map(|entry| {
                let Value::Array(fields) = entry else {
                    return None;
                };
                let [first, last, Value::Array(master), ..] = fields.as_slice() else {
                    return None;
                };
                let node = match master.as_slice() {
                    [_, _, id, ..] if text(id).is_some_and(|id| !id.is_empty()) => text(id)?,
                    [host, port, ..] => format!("{}:{}", text(host)?, number(port)?),
                    _ => return None,
                };
                Some((number(first)?, number(last)?, node))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self { ranges })
    }

    /// The node that serves `slot`, when the map has it.
    fn node(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, node)| node.as_str())
    }
}

/// Sends the renewals of `batch` on `conn` as pipelines routed by node (see the module's
/// documentation). Answers, for each lease in order, the reply of its [`scripts::RENEW_MANY`]
/// call of one lease (the server time in ms, or 0 when it is not ours), or `None` when it is
/// to be sent again on its own.
pub(crate) async fn renew(
    conn: &ClusterConnection,
    batch: &[(Keys, &LeaseToken, Duration)],
) -> Vec<Option<Value>> {
    let mut answers = vec![None; batch.len()];
    if batch.is_empty() {
        return answers;
    }
    let Some(map) = SlotMap::read(&mut conn.clone()).await else {
        return answers;
    };
    // The leases of each node, in order, with the slot of each lease's key.
    let mut by_node: HashMap<&str, Vec<(usize, u16)>> = HashMap::new();
    for (at, (keys, _, ttl)) in batch.iter().enumerate() {
        if lock_core::backend::validate_ttl(*ttl).is_err() {
            continue;
        }
        let slot = slot_of(keys.lock.as_bytes());
        if let Some(node) = map.node(slot) {
            by_node.entry(node).or_default().push((at, slot));
        }
    }
    let chunks: Vec<&[(usize, u16)]> = by_node
        .values()
        .flat_map(|leases| leases.chunks(scripts::RENEW_MANY_CHUNK))
        .collect();
    let sends = chunks
        .iter()
        .map(|chunk| send(conn, batch, chunk, Cached::Yes));
    // A node that does not know the script (restarted, flushed, new) answers each call
    // `NOSCRIPT` and runs none: those calls go again as one pipeline, its first call with
    // the script's source, which leaves the script cached for the calls after it.
    let mut again: Vec<Vec<(usize, u16)>> = Vec::new();
    for (chunk, replies) in chunks.iter().zip(futures::future::join_all(sends).await) {
        let unknown = answer(&mut answers, chunk, replies);
        if !unknown.is_empty() {
            again.push(unknown);
        }
    }
    let resends = again
        .iter()
        .map(|chunk| send(conn, batch, chunk, Cached::No));
    for (chunk, replies) in again.iter().zip(futures::future::join_all(resends).await) {
        answer(&mut answers, chunk, replies);
    }
    answers
}

/// Whether the node is expected to know the script: [`Cached::No`] sends the first call
/// with its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cached {
    Yes,
    No,
}

/// The calls of `chunk` (leases of `batch` by index, with their slot), as one pipeline to the
/// node serving the first lease's slot (by the client's slot map): the node of every lease in
/// the chunk, as the map read by [`renew`] tells.
async fn send(
    conn: &ClusterConnection,
    batch: &[(Keys, &LeaseToken, Duration)],
    chunk: &[(usize, u16)],
    cached: Cached,
) -> redis::RedisResult<Vec<Value>> {
    let Some((_, first_slot)) = chunk.first() else {
        return Ok(Vec::new());
    };
    let mut pipe = redis::pipe();
    for (i, (at, _)) in chunk.iter().enumerate() {
        let (keys, token, ttl) = &batch[*at];
        let call = scripts::RENEW_MANY
            .key(&keys.lock)
            .arg(token.as_str())
            .arg(millis(*ttl));
        pipe.add_command(if i == 0 && cached == Cached::No {
            call.by_source()
        } else {
            call.by_hash()
        });
    }
    let route = SingleNodeRoutingInfo::SpecificNode(Route::new(*first_slot, SlotAddr::Master));
    conn.clone()
        .route_pipeline(pipe, 0, chunk.len(), route)
        .await
}

/// Puts the replies of `chunk`'s pipeline into `answers` (see [`renew`]); returns the leases
/// of the chunk whose call the node answered `NOSCRIPT` (it ran none of them), to be sent
/// again. A pipeline that failed as a whole, or answered with another number of replies,
/// leaves its leases unanswered.
fn answer(
    answers: &mut [Option<Value>],
    chunk: &[(usize, u16)],
    replies: redis::RedisResult<Vec<Value>>,
) -> Vec<(usize, u16)> {
    let mut unknown = Vec::new();
    let Ok(replies) = replies else {
        return unknown;
    };
    if replies.len() != chunk.len() {
        return unknown;
    }
    for (lease, reply) in chunk.iter().zip(replies) {
        if unknown_script_reply(&reply) {
            unknown.push(*lease);
        } else if let Some(slot) = answers.get_mut(lease.0) {
            *slot = one_lease(reply);
        }
    }
    unknown
}

/// The cluster's slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, when not empty) or else of the whole key, modulo 16,384.
fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16_384
}

/// The one number of a [`scripts::RENEW_MANY`] reply of one lease; `None` for an error or any
/// other shape.
fn one_lease(reply: Value) -> Option<Value> {
    match reply {
        Value::Array(mut values) if values.len() == 1 => values.pop(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn the_slot_map_names_each_ranges_master() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(17001), bulk("id-a")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(17004), bulk("id-d")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(17002), bulk("id-b")]),
            ]),
        ]);
        let map = SlotMap::parse(&reply);
        assert_eq!(map.as_ref().and_then(|m| m.node(5460)), Some("id-a"));
        assert_eq!(map.as_ref().and_then(|m| m.node(5461)), Some("id-b"));
        assert_eq!(map.as_ref().and_then(|m| m.node(16383)), Some("id-b"));
    }

    #[test]
    fn masters_without_an_id_are_named_by_address() {
        let range = |first: i64, host: Value, port: i64| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(first + 99),
                Value::Array(vec![host, Value::Int(port)]),
            ])
        };
        let reply = Value::Array(vec![
            range(0, bulk("10.0.0.1"), 6379),
            range(100, bulk("10.0.0.2"), 6379),
            range(200, Value::Nil, 6380),
        ]);
        let map = SlotMap::parse(&reply);
        assert_eq!(map.as_ref().and_then(|m| m.node(0)), Some("10.0.0.1:6379"));
        assert_eq!(
            map.as_ref().and_then(|m| m.node(150)),
            Some("10.0.0.2:6379")
        );
        assert_eq!(map.as_ref().and_then(|m| m.node(299)), Some(":6380"));
        assert_eq!(map.as_ref().and_then(|m| m.node(300)), None);
    }

    #[test]
    fn a_reply_of_another_shape_is_no_map() {
        assert_eq!(SlotMap::parse(&Value::Nil), None);
        assert_eq!(
            SlotMap::parse(&Value::Array(vec![Value::Array(vec![Value::Int(0)])])),
            None
        );
        assert_eq!(
            SlotMap::parse(&Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(70_000),
                Value::Array(vec![bulk("h"), Value::Int(1)]),
            ])])),
            None
        );
    }

    #[test]
    fn slots_are_the_ones_the_client_routes_by() {
        for key in [
            "lock:{a}",
            "prefix:{bench/renew/7}:lock",
            "no tag at all",
            "{}empty tag",
            "{first}{second}",
            "open { only",
            "",
        ] {
            assert_eq!(
                Route::new(slot_of(key.as_bytes()), SlotAddr::Master),
                Route::with_key(key, SlotAddr::Master),
                "{key}"
            );
        }
    }

    fn parsed(reply: &[u8]) -> Value {
        redis::parse_redis_value(reply).unwrap_or(Value::Nil)
    }

    #[test]
    fn calls_answered_noscript_go_again_and_the_others_are_answered() {
        let noscript = || parsed(b"-NOSCRIPT No matching script.\r\n");
        assert!(unknown_script_reply(&noscript()));
        assert!(!unknown_script_reply(&parsed(b"-ERR other\r\n")));
        assert!(!unknown_script_reply(&Value::Array(vec![Value::Int(7)])));
        let chunk = [(0, 10), (2, 10), (1, 10)];
        let mut answers = vec![None; 3];
        let replies = vec![
            Value::Array(vec![Value::Int(7)]),
            noscript(),
            parsed(b"-ERR other\r\n"),
        ];
        let again = answer(&mut answers, &chunk, Ok(replies));
        assert_eq!(again, vec![(2, 10)]);
        assert_eq!(answers, vec![Some(Value::Int(7)), None, None]);
        // Another number of replies, or a pipeline that failed as a whole: nothing answered,
        // nothing sent again.
        let mut answers = vec![None; 3];
        assert!(answer(&mut answers, &chunk, Ok(vec![noscript()])).is_empty());
        let failed = Err(redis::RedisError::from(std::io::Error::other("gone")));
        assert!(answer(&mut answers, &chunk, failed).is_empty());
        assert_eq!(answers, vec![None, None, None]);
    }

    #[test]
    fn only_a_one_number_reply_counts() {
        assert_eq!(
            one_lease(Value::Array(vec![Value::Int(7)])),
            Some(Value::Int(7))
        );
        assert_eq!(one_lease(Value::Array(vec![])), None);
        assert_eq!(one_lease(Value::Int(7)), None);
        assert_eq!(
            redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n")
                .ok()
                .and_then(one_lease),
            None
        );
        assert!(
            matches!(
                redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n"),
                Ok(Value::ServerError(_))
            ),
            "a NOSCRIPT reply parses as a server error"
        );
    }
}
