//! The depth of the consumer's dead-letter queue, exported as the gauge
//! [`DEAD_LETTERS`](super::metric_names::DEAD_LETTERS).
//!
//! The consumer republishes what it gives up on to its dead-letter exchange
//! and counts that ([`DEAD_LETTERED_TOTAL`](super::metric_names::DEAD_LETTERED_TOTAL)),
//! but only the queue knows how many are still waiting for an operator: a
//! counter does not go down when someone replays or purges them. So while
//! a session is connected, a task reads the queue's message count with a
//! passive `queue.declare` at once and then every [`INTERVAL`], on a channel
//! of its own (a passive declare of a missing queue closes its channel, and
//! must not close the one the consumer reads from).
//!
//! Reading the depth never stops or slows the consumer: each broker call is
//! bounded by [`TIMEOUT`], a failure is logged at WARN and the gauge keeps
//! its last value until the next read succeeds.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::metric_names;
use crate::Result;
use crate::connection::bounded;
use crate::topology::short_string;

/// How often the depth is read (the first time as soon as the session is
/// connected).
pub(super) const INTERVAL: Duration = Duration::from_secs(15);
/// The limit of each broker call made to read it.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The task reading the depth for one session; stopped when dropped, so it
/// never outlives the connection it reads on.
pub(super) struct DepthPoller(JoinHandle<()>);

impl DepthPoller {
    /// Starts reading the depth of `queue` on `connection`, labelled with
    /// the consumer's name.
    pub(super) fn spawn(connection: Arc<Connection>, queue: String, consumer: String) -> Self {
        DepthPoller(tokio::spawn(poll(connection, queue, consumer)))
    }
}

impl Drop for DepthPoller {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn poll(connection: Arc<Connection>, queue: String, consumer: String) {
    let gauge = ::metrics::gauge!(metric_names::DEAD_LETTERS, "consumer" => consumer.clone());
    let mut channel = None;
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match read(&connection, &mut channel, &queue).await {
            // A message count is a u32: exact as f64.
            Ok(depth) => gauge.set(f64::from(depth)),
            Err(error) => {
                // Use a new channel next time. A missing queue has closed
                // this one already; one that timed out is closed here, so
                // failures do not pile up open channels on the connection.
                if let Some(stale) = channel.take()
                    && stale.status().connected()
                {
                    let _ = bounded(
                        "close the channel that read the dead-letter queue's depth",
                        TIMEOUT,
                        stale.close(200, "OK".into()),
                    )
                    .await;
                }
                tracing::warn!(
                    consumer = %consumer,
                    queue = %queue,
                    %error,
                    "reading the depth of the dead-letter queue failed; the gauge keeps its last value"
                );
            }
        }
    }
}

/// The number of messages ready in `queue`, read on `channel` (opened on
/// `connection` first when there is none or it is closed).
async fn read(connection: &Connection, channel: &mut Option<Channel>, queue: &str) -> Result<u32> {
    let open = match channel.take() {
        Some(open) if open.status().connected() => channel.insert(open),
        _ => {
            let opened = bounded(
                "open a channel to read the dead-letter queue's depth",
                TIMEOUT,
                connection.create_channel(),
            )
            .await?;
            channel.insert(opened)
        }
    };
    let declared = bounded(
        &format!("read the depth of the dead-letter queue `{queue}` (passive queue.declare)"),
        TIMEOUT,
        open.queue_declare(
            short_string("dead-letter queue name", queue)?,
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await?;
    Ok(declared.message_count())
}
