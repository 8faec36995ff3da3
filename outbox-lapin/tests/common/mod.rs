//! The broker objects of one test of a consumer: its exchange, its queue
//! (a `QueueTopology` with its dead-letter exchange and queue), declared
//! on the real RabbitMQ through the workspace's test kit, which deletes
//! them when the test ends, also when it panics.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lapin::message::BasicGetMessage;
use lapin::options::BasicGetOptions;
use lapin::{BasicProperties, Channel};
use outbox_core::testing::{InMemoryInbox, InboxTx};
use outbox_core::{DomainEvent, EventEnvelope, InboxDatabase};
use outbox_lapin::wire;
use outbox_lapin::{EventHandler, InboxConsumer, InboxConsumerBuilder, QueueTopology};
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::eventually::eventually;
use outbox_testkit::names;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use outbox_testkit::urls::amqp_url;

/// How long a consumer test waits for what must happen.
pub const WAIT: Duration = Duration::from_secs(20);

/// The event the consumer tests send: the `n`-th of an order.
#[derive(Serialize)]
pub struct Placed {
    pub order: String,
    pub n: u32,
}

impl DomainEvent for Placed {
    fn aggregate_type(&self) -> &'static str {
        "order"
    }
    fn event_type(&self) -> &'static str {
        "order.placed"
    }
    fn aggregate_id(&self) -> String {
        self.order.clone()
    }
}

/// The envelope of the `n`-th `order.placed` of `order`.
pub fn placed(order: &str, n: u32) -> EventEnvelope {
    EventEnvelope::from_event(&Placed {
        order: order.into(),
        n,
    })
    .unwrap()
}

/// A running consumer and the switch that stops it.
pub struct Running {
    stop: oneshot::Sender<()>,
    pub task: JoinHandle<outbox_lapin::Result<()>>,
}

impl Running {
    pub fn start<H: EventHandler<InboxTx>>(consumer: InboxConsumer<InMemoryInbox, H>) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(consumer.run(async {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    /// Stops the consumer; it must return `Ok` within [`WAIT`].
    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the consumer stops")
            .unwrap()
            .expect("run returns Ok after shutdown");
    }
}

/// This test's exchange, queue, dead-letter exchange and queue; deleted on
/// drop (also when the test panics).
pub struct Broker {
    pub channel: Channel,
    pub exchange: String,
    pub topology: QueueTopology,
    kit: TestBroker,
}

impl Broker {
    /// `<prefix>_<test>_<pid>_<n>.x`, and queue `….q` bound to it with
    /// `bindings`, dead-lettering to `….q.dlx` / `….q.dead`.
    pub async fn new(prefix: &str, test: &str, bindings: &[&str]) -> Broker {
        let kit = TestBroker::new(names::unique(prefix, test)).await;
        let exchange = kit.named("x");
        let topology = bindings.iter().fold(
            QueueTopology::new(kit.named("q")).exchange(&exchange),
            |topology, binding| topology.bind(*binding),
        );
        kit.delete_queue_on_drop(topology.queue_name());
        kit.delete_queue_on_drop(topology.dead_letter_queue_name().unwrap());
        kit.delete_exchange_on_drop(&exchange);
        kit.delete_exchange_on_drop(topology.dead_letter_exchange_name().unwrap());
        topology.declare(kit.channel()).await.unwrap();
        Broker {
            channel: kit.channel().clone(),
            exchange,
            topology,
            kit,
        }
    }

    /// A consumer of this test's queue, named for the test, with `inbox`
    /// and `handler`; the test sets the rest.
    pub fn consumer<D: InboxDatabase, H: EventHandler<D::Tx>>(
        &self,
        inbox: D,
        handler: H,
    ) -> InboxConsumerBuilder<D, H> {
        InboxConsumer::builder(
            amqp_url(),
            self.queue(),
            self.consumer_name(),
            inbox,
            handler,
        )
    }

    pub fn queue(&self) -> &str {
        self.topology.queue_name()
    }

    pub fn dead_letter_queue(&self) -> &str {
        self.topology.dead_letter_queue_name().unwrap()
    }

    pub fn dlq(&self) -> &str {
        self.dead_letter_queue()
    }

    pub fn dlx(&self) -> &str {
        self.topology.dead_letter_exchange_name().unwrap()
    }

    /// A consumer name unique to this broker (and so a connection name
    /// `rabbitmqctl` can find).
    pub fn consumer_name(&self) -> String {
        format!("{}.consumer", self.exchange)
    }

    /// Publishes to `exchange`, mandatory; asserts it was confirmed and
    /// routed.
    pub async fn publish_to(&self, exchange: &str, key: &str, body: &[u8], props: BasicProperties) {
        let confirm = self.kit.publish(exchange, key, body, props).await;
        assert_eq!(
            confirm,
            lapin::Confirmation::Ack(None),
            "published and routed"
        );
    }

    /// Publishes to the test's exchange with `routing_key`.
    pub async fn publish_raw(&self, routing_key: &str, body: &[u8], properties: BasicProperties) {
        self.publish_to(&self.exchange, routing_key, body, properties)
            .await;
    }

    /// Publishes `envelope` as the relay would.
    pub async fn publish(&self, envelope: &EventEnvelope) {
        self.publish_raw(
            &envelope.event_type,
            envelope.payload.as_bytes(),
            wire::properties(envelope, "/tests"),
        )
        .await;
    }

    pub async fn ready(&self, queue: &str) -> u32 {
        self.kit.ready(queue).await
    }

    /// Waits until `queue` holds `n` ready messages.
    pub async fn wait_ready(&self, queue: &str, n: u32) {
        eventually(format!("`{queue}` holds {n} messages"))
            .within(WAIT)
            .equals(n, || self.ready(queue))
            .await;
    }

    /// Takes `n` messages from the dead-letter queue (no more), waiting for
    /// them.
    pub async fn dead_letters(&self, n: usize) -> Vec<BasicGetMessage> {
        let got = std::sync::Mutex::new(Vec::new());
        eventually(format!("{n} dead letters arrived"))
            .within(WAIT)
            .until(|| async {
                while got.lock().unwrap().len() < n {
                    let Some(message) = self
                        .channel
                        .basic_get(
                            self.dead_letter_queue().into(),
                            BasicGetOptions { no_ack: true },
                        )
                        .await
                        .unwrap()
                    else {
                        return false;
                    };
                    got.lock().unwrap().push(message);
                }
                true
            })
            .await;
        got.into_inner().unwrap()
    }

    /// The message ids in `queue`, in order, with their properties, leaving
    /// them there (got and requeued on a channel that is then closed: a
    /// classic queue keeps their places).
    pub async fn peek(&self, queue: &str) -> Vec<(String, BasicProperties)> {
        self.kit
            .peek(queue)
            .await
            .into_iter()
            .map(|got| {
                let id = got
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string())
                    .unwrap_or_default();
                (id, got.delivery.properties)
            })
            .collect()
    }
}
