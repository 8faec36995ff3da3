//! One connection's worth of consuming: connected, the topology declared,
//! the dead-letter exchange checked, the prefetch set and the queue
//! subscribed to.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::{BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ExchangeKind};
use uuid::Uuid;

use super::Settings;
use super::depth::DepthPoller;
use super::republish::Republisher;
use crate::connection::connect_to_node;
use crate::topology::short_string;
use crate::{Error, Result};

/// One connection's worth of consuming.
pub(super) struct Session {
    pub(super) connection: Arc<Connection>,
    pub(super) channel: Channel,
    pub(super) consumer: lapin::Consumer,
    pub(super) republisher: Arc<Republisher>,
    /// Reads the dead-letter queue's depth while the session lasts.
    pub(super) depth: Option<DepthPoller>,
}

/// Why a session ended.
pub(super) enum Ended {
    /// The shutdown future completed; the session is kept open until the
    /// workers have acked.
    Shutdown(Box<Session>),
    /// The connection or channel was lost.
    Lost(String),
}

/// How long connecting, declaring and subscribing may take together before
/// the consumer gives up on that try and reconnects.
pub(super) const SESSION_TIMEOUT: Duration = Duration::from_secs(30);

/// No node yet in [`open_session`]'s `node`.
pub(super) const NO_NODE: usize = usize::MAX;

/// Connects, declares, checks the dead-letter exchange and subscribes.
/// Stores the index of the URL it connected to in `node` as soon as it
/// has one (the caller bounds this future and drops it on timeout), and
/// remembers that node as working once the session is complete.
pub(super) async fn open_session(settings: &Settings, node: &AtomicUsize) -> Result<Session> {
    let (connection, index) = connect_to_node(&settings.urls, &settings.name).await?;
    node.store(index, Ordering::Relaxed);
    let session = set_up(settings, Arc::new(connection)).await?;
    settings.urls.worked(index);
    Ok(session)
}

/// Declares, checks the dead-letter exchange and subscribes on `connection`.
async fn set_up(settings: &Settings, connection: Arc<Connection>) -> Result<Session> {
    if let Some(topology) = &settings.topology {
        let channel = connection
            .create_channel()
            .await
            .map_err(Error::amqp("open a channel to declare the topology"))?;
        topology.declare(&channel).await?;
        let _ = channel.close(200, "OK".into()).await;
    }
    let republisher =
        Arc::new(Republisher::open(connection.clone(), settings.confirm_timeout).await?);
    let channel = connection
        .create_channel()
        .await
        .map_err(Error::amqp("open the consume channel"))?;
    let dead_letter_exchange = &settings.dead_letter_exchange;
    channel
        .exchange_declare(
            short_string("dead-letter exchange name", dead_letter_exchange)?,
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(Error::amqp(format!(
            "check that the dead-letter exchange `{dead_letter_exchange}` exists (declare it, \
             e.g. with QueueTopology)"
        )))?;
    channel
        .basic_qos(settings.prefetch, BasicQosOptions::default())
        .await
        .map_err(Error::amqp("set the prefetch (basic.qos)"))?;
    let queue = &settings.queue;
    let consumer = channel
        .basic_consume(
            short_string("queue name", queue)?,
            consumer_tag(&settings.name),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(Error::amqp(format!("consume queue `{queue}`")))?;
    let depth = settings
        .dead_letter_queue
        .as_ref()
        .map(|dead_letter_queue| {
            DepthPoller::spawn(
                connection.clone(),
                dead_letter_queue.clone(),
                settings.name.clone(),
            )
        });
    Ok(Session {
        connection,
        channel,
        consumer,
        republisher,
        depth,
    })
}

/// `<name>.<uuid>`, cut to fit a short string.
fn consumer_tag(name: &str) -> lapin::types::ShortString {
    let mut prefix = name;
    let mut end = prefix.len().min(200);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    prefix = &prefix[..end];
    // At most 200 + 1 + 36 bytes: within the 255-byte limit.
    format!("{prefix}.{}", Uuid::now_v7()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_tags_fit_a_short_string() {
        let tag = consumer_tag(&"é".repeat(200));
        assert!(tag.as_str().len() <= 255);
        assert!(consumer_tag("loyalty").as_str().starts_with("loyalty."));
    }
}
