//! RabbitMQ for tests: a connection that says how to start the broker, a
//! broker guard ([`TestBroker`]) whose exchanges and queues are deleted
//! when it is dropped, also when the test panics, and the `rabbitmqctl`
//! helpers that find and force-close connections by name.

use std::process::Command;
use std::sync::Mutex;

use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};

use crate::{teardown, urls};

/// A connection to the broker at `url`, named `name` (the client-provided
/// name `rabbitmqctl list_connections` shows), or a panic saying where and
/// how to start RabbitMQ.
///
/// # Panics
/// When RabbitMQ does not answer at `url`.
pub async fn connect(url: &str, name: &str) -> Connection {
    Connection::connect(
        url,
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
    .unwrap_or_else(|e| panic!("{}", urls::unreachable("RabbitMQ", url, &e)))
}

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

/// Declares exchange `name` on `channel` as told (not deleted on drop: see
/// [`TestBroker::exchange`]).
///
/// # Panics
/// When the broker refuses.
pub async fn declare_exchange(
    channel: &Channel,
    name: &str,
    kind: ExchangeKind,
    options: ExchangeDeclareOptions,
) {
    channel
        .exchange_declare(name.into(), kind, options, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("declaring exchange {name}: {e}"));
}

/// Declares queue `name` on `channel` as told (not deleted on drop: see
/// [`TestBroker::queue_with`]).
///
/// # Panics
/// When the broker refuses.
pub async fn declare_queue(
    channel: &Channel,
    name: &str,
    options: QueueDeclareOptions,
    arguments: FieldTable,
) {
    channel
        .queue_declare(name.into(), options, arguments)
        .await
        .unwrap_or_else(|e| panic!("declaring queue {name}: {e}"));
}

/// Binds `queue` to `exchange` with `routing_key`, on `channel`.
///
/// # Panics
/// When the broker refuses.
pub async fn bind(channel: &Channel, queue: &str, exchange: &str, routing_key: &str) {
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("binding {queue} to {exchange} with {routing_key}: {e}"));
}

/// Messages ready in `queue` (a passive declare on `channel`).
///
/// # Panics
/// When the queue does not exist.
pub async fn ready(channel: &Channel, queue: &str) -> u32 {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("queue {queue}: {e}"))
        .message_count()
}

/// Every message now in `queue`, by `basic.get` until it is empty.
async fn get_all(channel: &Channel, queue: &str, no_ack: bool) -> Vec<BasicGetMessage> {
    let mut messages = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack })
        .await
        .unwrap_or_else(|e| panic!("basic.get from {queue}: {e}"))
    {
        messages.push(message);
    }
    messages
}

/// The exchanges and queues of one test, deleted when it is dropped (also
/// when the test panics), with a connection opened only then: for code
/// that declares them over connections of its own, which a test may break
/// (a broker restarted, a node frozen). [`TestBroker`] holds one.
pub struct BrokerCleanup {
    url: String,
    name: String,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
}

impl std::fmt::Debug for BrokerCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerCleanup")
            .field("url", &urls::redact(&self.url))
            .field("name", &self.name)
            .field("queues", &self.queues)
            .field("exchanges", &self.exchanges)
            .finish()
    }
}

impl BrokerCleanup {
    /// Nothing to delete yet on the broker at `url`; `name` names the
    /// teardown's connection (`<name>.teardown`) and its messages.
    pub fn new(url: &str, name: &str) -> BrokerCleanup {
        BrokerCleanup {
            url: url.to_owned(),
            name: name.to_owned(),
            queues: Mutex::default(),
            exchanges: Mutex::default(),
        }
    }

    /// Deletes queue `name` on drop.
    pub fn queue(&self, name: impl Into<String>) {
        if let Ok(mut queues) = self.queues.lock() {
            queues.push(name.into());
        }
    }

    /// Deletes exchange `name` on drop.
    pub fn exchange(&self, name: impl Into<String>) {
        if let Ok(mut exchanges) = self.exchanges.lock() {
            exchanges.push(name.into());
        }
    }
}

impl Drop for BrokerCleanup {
    fn drop(&mut self) {
        let queues = self.queues.lock().map(|q| q.clone()).unwrap_or_default();
        let exchanges = self.exchanges.lock().map(|e| e.clone()).unwrap_or_default();
        if queues.is_empty() && exchanges.is_empty() {
            return;
        }
        let url = self.url.clone();
        let name = self.name.clone();
        // A connection of its own: the test's may be the one it broke
        // (closed by the broker, or its runtime is gone).
        teardown::run(&format!("broker objects of {name}"), async move {
            let properties = ConnectionProperties::default()
                .with_connection_name(format!("{name}.teardown").into());
            let Ok(connection) = Connection::connect(&url, properties).await else {
                teardown::warn(&format!(
                    "{name}: broker unreachable, {queues:?} and {exchanges:?} left behind"
                ));
                return;
            };
            if let Ok(channel) = connection.create_channel().await {
                for queue in &queues {
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                for exchange in &exchanges {
                    let _ = channel
                        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
            }
            let _ = connection.close(200, "teardown".into()).await;
        });
    }
}

/// A client connection of a broker, from `rabbitmqctl list_connections pid
/// client_properties`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConnection {
    /// The Erlang pid `rabbitmqctl close_connection` takes.
    pub pid: String,
    /// The client-provided connection name (empty when it gave none).
    pub name: String,
}

/// The connections listed in `listing` (the output of `rabbitmqctl -q
/// list_connections pid client_properties`).
///
/// ```
/// use outbox_testkit::amqp::parse_connections;
///
/// let listing = "<rabbit@h.1.2.3>\t[{\"product\",\"lapin\"},{\"connection_name\",\"t.relay\"}]\n\
///                <rabbit@h.1.2.4>\t[{\"product\",\"lapin\"}]\n";
/// let found = parse_connections(listing);
/// assert_eq!(found.len(), 2);
/// assert_eq!(found[0].pid, "<rabbit@h.1.2.3>");
/// assert_eq!(found[0].name, "t.relay");
/// assert_eq!(found[1].name, "");
/// ```
pub fn parse_connections(listing: &str) -> Vec<ClientConnection> {
    const KEY: &str = "{\"connection_name\",\"";
    listing
        .lines()
        .filter_map(|line| {
            let pid = line.split_whitespace().next()?.to_owned();
            let name = line
                .find(KEY)
                .and_then(|start| {
                    let rest = &line[start + KEY.len()..];
                    rest.find('"').map(|end| rest[..end].to_owned())
                })
                .unwrap_or_default();
            Some(ClientConnection { pid, name })
        })
        .collect()
}

/// The client connections of the shared broker (`rabbitmqctl`).
///
/// # Panics
/// When `rabbitmqctl` cannot run or fails.
pub fn connections() -> Vec<ClientConnection> {
    let output = Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .unwrap_or_else(|e| {
            panic!("rabbitmqctl: {e} (install RabbitMQ with scripts/dev-services)")
        });
    assert!(
        output.status.success(),
        "rabbitmqctl list_connections failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    parse_connections(&String::from_utf8_lossy(&output.stdout))
}

/// The pid of the shared broker's connection named exactly `name`.
pub fn connection_pid(name: &str) -> Option<String> {
    connections()
        .into_iter()
        .find(|c| c.name == name)
        .map(|c| c.pid)
}

/// Force-closes (`rabbitmqctl close_connection`) every connection of the
/// shared broker whose name `matches`; returns how many it closed (one
/// may be gone between the listing and the close).
pub fn close_connections_where(matches: impl Fn(&str) -> bool) -> usize {
    connections()
        .iter()
        .filter(|c| matches(&c.name))
        .filter(|c| {
            Command::new("rabbitmqctl")
                .args(["close_connection", &c.pid, "fault injected by test"])
                .output()
                .is_ok_and(|out| out.status.success())
        })
        .count()
}

/// Force-closes the shared broker's connections whose name starts with
/// `prefix`; returns how many.
pub fn close_connections(prefix: &str) -> usize {
    close_connections_where(|name| name.starts_with(prefix))
}

/// Force-closes the shared broker's connections named exactly `name`;
/// returns how many.
pub fn close_connection(name: &str) -> usize {
    close_connections_where(|n| n == name)
}
