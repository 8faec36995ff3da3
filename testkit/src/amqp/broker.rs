//! [`TestBroker`]: a test's exchanges and queues, declared through it and
//! deleted when it is dropped.

use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};

use super::{BrokerCleanup, bind, connect, declare_exchange, declare_queue, get_all, ready};
use crate::urls;

/// An exchange and queues of one test, declared through it and deleted
/// when it is dropped: at the end of the test, also when it panics,
/// whether or not a runtime is running.
///
/// Its channel is in confirm mode: [`publish`](Self::publish) waits for
/// the broker's ack. What the test declares some other way (a
/// `QueueTopology`, the code under test) is deleted too once named with
/// [`delete_queue_on_drop`](Self::delete_queue_on_drop) or
/// [`delete_exchange_on_drop`](Self::delete_exchange_on_drop).
///
/// ```no_run
/// # async fn f() {
/// use outbox_testkit::amqp::TestBroker;
/// use outbox_testkit::names::unique;
///
/// let broker = TestBroker::new(unique("test", "wire")).await;
/// let exchange = broker.topic_exchange(&broker.named("x")).await;
/// let queue = broker.queue(&broker.named("q")).await;
/// broker.bind(&queue, &exchange, "#").await;
/// assert_eq!(broker.ready(&queue).await, 0);
/// # }
/// ```
pub struct TestBroker {
    url: String,
    name: String,
    connection: Connection,
    channel: Channel,
    cleanup: BrokerCleanup,
}

impl std::fmt::Debug for TestBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestBroker")
            .field("name", &self.name)
            .field("cleanup", &self.cleanup)
            .finish_non_exhaustive()
    }
}

impl TestBroker {
    /// A guard on the shared broker ([`urls::amqp_url`]); `name` (e.g. from
    /// [`names::unique`](crate::names::unique)) is the prefix of what it
    /// declares, and its connection is named `<name>.setup`.
    ///
    /// # Panics
    /// When RabbitMQ is not reachable (saying how to start it).
    pub async fn new(name: impl Into<String>) -> TestBroker {
        TestBroker::on(&urls::amqp_url(), name).await
    }

    /// As [`TestBroker::new`], on the broker at `url` (e.g. a
    /// [`PrivateRabbit`](crate::servers::PrivateRabbit)).
    ///
    /// # Panics
    /// When RabbitMQ is not reachable (saying how to start it).
    pub async fn on(url: &str, name: impl Into<String>) -> TestBroker {
        let name = name.into();
        let connection = connect(url, &format!("{name}.setup")).await;
        let channel = connection
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("{name}: a channel: {e}"));
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: confirm mode: {e}"));
        TestBroker {
            cleanup: BrokerCleanup::new(url, &name),
            url: url.to_owned(),
            name,
            connection,
            channel,
        }
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<name>.<suffix>`: a name of this test.
    pub fn named(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.name)
    }

    /// The broker's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The guard's connection.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The guard's channel (in confirm mode).
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Deletes queue `name` on drop, as if declared through the guard.
    pub fn delete_queue_on_drop(&self, name: impl Into<String>) {
        self.cleanup.queue(name);
    }

    /// Deletes exchange `name` on drop, as if declared through the guard.
    pub fn delete_exchange_on_drop(&self, name: impl Into<String>) {
        self.cleanup.exchange(name);
    }

    /// Declares a durable topic exchange `name` (deleted on drop); returns
    /// its name.
    pub async fn topic_exchange(&self, name: &str) -> String {
        self.exchange(
            name,
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
        )
        .await
    }

    /// Declares exchange `name` as told (deleted on drop); returns its name.
    ///
    /// # Panics
    /// When the broker refuses.
    pub async fn exchange(
        &self,
        name: &str,
        kind: ExchangeKind,
        options: ExchangeDeclareOptions,
    ) -> String {
        self.delete_exchange_on_drop(name);
        declare_exchange(&self.channel, name, kind, options).await;
        name.to_owned()
    }

    /// Declares a durable queue `name` (deleted on drop); returns its name.
    pub async fn queue(&self, name: &str) -> String {
        self.queue_with(
            name,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
    }

    /// Declares queue `name` as told (deleted on drop); returns its name.
    ///
    /// # Panics
    /// When the broker refuses.
    pub async fn queue_with(
        &self,
        name: &str,
        options: QueueDeclareOptions,
        arguments: FieldTable,
    ) -> String {
        self.delete_queue_on_drop(name);
        declare_queue(&self.channel, name, options, arguments).await;
        name.to_owned()
    }

    /// Binds `queue` to `exchange` with `routing_key`.
    ///
    /// # Panics
    /// When the broker refuses.
    pub async fn bind(&self, queue: &str, exchange: &str, routing_key: &str) {
        bind(&self.channel, queue, exchange, routing_key).await;
    }

    /// Messages ready in `queue` (a passive declare).
    ///
    /// # Panics
    /// When the queue does not exist.
    pub async fn ready(&self, queue: &str) -> u32 {
        ready(&self.channel, queue).await
    }

    /// Publishes `body` to `exchange` with `routing_key`, mandatory, and
    /// waits for the broker's confirm; returns it (`Ack(None)`: routed and
    /// taken; `Ack(Some(returned))`: unroutable).
    ///
    /// # Panics
    /// When the broker refuses or the channel closes.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Confirmation {
        self.channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await
            .unwrap_or_else(|e| panic!("publishing to {exchange:?} with {routing_key}: {e}"))
            .await
            .unwrap_or_else(|e| panic!("confirm of a publish to {exchange:?}: {e}"))
    }

    /// Takes every message now in `queue` (acknowledged on the way), in
    /// order.
    pub async fn drain(&self, queue: &str) -> Vec<BasicGetMessage> {
        get_all(&self.channel, queue, true).await
    }

    /// Every message now in `queue`, in order, left there: got without ack
    /// on a channel of their own that is then closed, so the broker
    /// requeues them in their places.
    ///
    /// # Panics
    /// When the channel cannot be opened or closed.
    pub async fn peek(&self, queue: &str) -> Vec<BasicGetMessage> {
        let channel = self
            .connection
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("a channel to peek at {queue}: {e}"));
        let messages = get_all(&channel, queue, false).await;
        channel
            .close(200, "peeked".into())
            .await
            .unwrap_or_else(|e| panic!("closing the channel that peeked at {queue}: {e}"));
        messages
    }
}
