//! [`Subscriber`]: the pub/sub connection on which one client's waiters hear release messages:
//! to one server, or to a cluster.
//!
//! On a cluster the messages go on shard channels (`SSUBSCRIBE`, `SPUBLISH`): a shard channel
//! lives on the node of its slot, and a release channel has its lock's hash tag, so a release
//! message stays on the lock's node, where a plain `PUBLISH` crosses the cluster bus to every
//! node. The connection is a cluster connection over RESP3 (shard channels need it in the
//! `redis` crate), which sends each `SSUBSCRIBE` to the node of the channel's slot.

use std::time::Duration;

use futures::{StreamExt, channel::mpsc, future::ready, stream::BoxStream};
use redis::{
    PushInfo, PushKind, RedisResult, Value, aio::PubSubSink, cluster_async::ClusterConnection,
};

use crate::connection;

/// Where a client's pub/sub connection goes.
#[derive(Debug, Clone)]
pub(crate) enum Subscriber {
    /// One server (a single server, or one Redlock server): plain channels.
    Single(redis::Client),
    /// A cluster through these seed nodes, each network step bounded by the time-out: shard
    /// channels.
    Cluster(Vec<String>, Duration),
}

/// The sending half of a pub/sub connection: its subscriptions.
#[derive(Clone)]
pub(crate) enum Sink {
    /// On one server.
    Single(PubSubSink),
    /// On a cluster (shard channels).
    Cluster(ClusterConnection),
}

/// What a pub/sub connection hears, until it ends (on a cluster, until any of its node
/// connections drops: what was subscribed there may have missed a message, so its waiters
/// subscribe again on a new connection).
pub(crate) type Events = BoxStream<'static, Event>;

/// One thing a pub/sub connection heard.
#[derive(Debug)]
pub(crate) enum Event {
    /// A release message: its channel and payload.
    Message(String, String),
    /// The server ended the subscription of this shard channel on its own: its slot moved to
    /// another node (or the confirmation of an unsubscribe the waiters asked for). The
    /// `redis` crate forgets the channel, so it does not subscribe it again anywhere.
    Dropped(String),
}

impl Subscriber {
    /// Opens a pub/sub connection.
    pub(crate) async fn connect(&self) -> RedisResult<(Sink, Events)> {
        match self {
            Self::Single(client) => {
                let (sink, stream) = client.get_async_pubsub().await?.split();
                let messages = stream.map(|message| {
                    let payload: String = message.get_payload().unwrap_or_default();
                    Event::Message(message.get_channel_name().to_owned(), payload)
                });
                Ok((Sink::Single(sink), messages.boxed()))
            }
            Self::Cluster(urls, timeout) => {
                let (pushes, received) = mpsc::unbounded();
                let conn = connection::cluster_builder(urls, *timeout)
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(pushes)
                    .build()?
                    .get_async_connection()
                    .await?;
                let messages = received
                    .take_while(|push: &PushInfo| ready(push.kind != PushKind::Disconnection))
                    .filter_map(|push| ready(shard_event(push)));
                Ok((Sink::Cluster(conn), messages.boxed()))
            }
        }
    }
}

/// What a push on a cluster connection says of shard channels; `None` for anything else (the
/// confirmations of subscriptions, say).
fn shard_event(push: PushInfo) -> Option<Event> {
    let text = |value: &Value| redis::from_redis_value_ref::<String>(value).ok();
    match (push.kind, &push.data[..]) {
        (PushKind::SMessage, [channel, payload]) => Some(Event::Message(
            text(channel)?,
            text(payload).unwrap_or_default(),
        )),
        (PushKind::SUnsubscribe, [channel, ..]) => Some(Event::Dropped(text(channel)?)),
        _ => None,
    }
}

impl Sink {
    /// Subscribes to `channel` (a shard channel on a cluster).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Single(sink) => sink.subscribe(channel).await,
            Self::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    /// Whether the connection reports the end of each subscription ([`Event::Dropped`]), the
    /// ones it asked for included: a cluster's does.
    pub(crate) fn reports_drops(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Unsubscribes from `channel`.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Single(sink) => sink.unsubscribe(channel).await,
            Self::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}
