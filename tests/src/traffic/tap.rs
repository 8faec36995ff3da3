//! The verifying tap: records every message the relay got to the broker.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::Tick;
use crate::Scenario;

/// One message received by the [`Tap`].
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The event id (`message_id`).
    pub id: Uuid,
    /// From the payload.
    pub aggregate: String,
    /// From the payload.
    pub seq: i32,
    /// The broker's `redelivered` flag: the tap saw it before but its ack
    /// was lost with its connection.
    pub redelivered: bool,
    /// When the tap received it.
    pub at: std::time::Instant,
}

/// The verifying consumer: records every message on the scenario's tap
/// queue, in arrival order, acking each after recording it; reconnects when
/// its connection is lost (a broker outage).
#[derive(Debug)]
pub struct Tap {
    received: Arc<Mutex<Vec<Delivery>>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Tap {
    /// Starts consuming the scenario's tap queue.
    pub fn start(scenario: &Scenario) -> Tap {
        let received: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let url = scenario.servers.amqp_url.clone();
        let queue = scenario.tap_queue.clone();
        let name = format!("{}.tap", scenario.name);
        let sink = Arc::clone(&received);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = consume(&url, &queue, &name, &sink) => {}
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        });
        Tap {
            received,
            stop: Some(stop),
            task,
        }
    }

    /// Every message so far, in arrival order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The distinct event ids so far.
    pub fn unique_ids(&self) -> HashSet<Uuid> {
        self.received
            .lock()
            .map(|r| r.iter().map(|d| d.id).collect())
            .unwrap_or_default()
    }

    /// Stops consuming.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the tap waits for a delivery before it consumes afresh.
const TAP_IDLE: Duration = Duration::from_secs(5);

/// Consumes until the connection or the consumer ends, or nothing arrives
/// for [`TAP_IDLE`].
async fn consume(url: &str, queue: &str, name: &str, sink: &Mutex<Vec<Delivery>>) {
    // Bounded: a broker that is starting may accept TCP and not answer.
    // `url` may list several nodes (comma-separated): the first that
    // answers, each bounded (a broker that is starting may accept TCP and
    // not answer).
    let Ok(conn) = outbox_testkit::amqp::connect_any(url, name).await else {
        return;
    };
    let Ok(channel) = conn.create_channel().await else {
        return;
    };
    if channel
        .basic_qos(500, BasicQosOptions::default())
        .await
        .is_err()
    {
        return;
    }
    let Ok(mut consumer) = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
    else {
        return;
    };
    loop {
        // Idle for a while: consume afresh. A quorum queue's consumer on
        // a surviving node was seen (once, RabbitMQ 3.10, a cluster node
        // stopped) to get nothing more and no cancel, though the queue
        // held messages; every delivery is acked as it is recorded, so
        // nothing is in flight when the tap is idle.
        let delivery = match tokio::time::timeout(TAP_IDLE, consumer.next()).await {
            Ok(Some(Ok(delivery))) => delivery,
            Ok(_) => return,
            Err(_) => {
                let _ = conn.close(200, "tap idle: consuming afresh".into()).await;
                return;
            }
        };
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .and_then(|id| Uuid::parse_str(id.as_str()).ok());
        let tick: Option<Tick> = serde_json::from_slice(&delivery.data).ok();
        let (Some(id), Some(tick)) = (id, tick) else {
            panic!(
                "the tap got a message that is not a Tick with an event id: {:?}",
                String::from_utf8_lossy(&delivery.data)
            );
        };
        if let Ok(mut sink) = sink.lock() {
            sink.push(Delivery {
                id,
                aggregate: tick.aggregate,
                seq: tick.seq,
                redelivered: delivery.redelivered,
                at: std::time::Instant::now(),
            });
        }
        if delivery.ack(BasicAckOptions::default()).await.is_err() {
            return;
        }
    }
}
