//! RabbitMQ for tests: a connection that says how to start the broker, a
//! broker guard ([`TestBroker`]) whose exchanges and queues are deleted
//! when it is dropped, also when the test panics, and the `rabbitmqctl`
//! helpers that find and force-close connections by name.
//!
//! One file per job: the guard in `broker`, its teardown in `cleanup`, the
//! `rabbitmqctl` helpers in `connections`, plain declarations here.

mod broker;
mod cleanup;
mod connections;

pub use broker::TestBroker;
pub use cleanup::BrokerCleanup;
pub use connections::{
    ClientConnection, close_connection, close_connections, close_connections_where, connection_pid,
    connections, parse_connections,
};

use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::urls;

/// A connection to the broker at `url`, named `name` (the client-provided
/// name `rabbitmqctl list_connections` shows), or a panic saying where and
/// how to start RabbitMQ. `url` may be a comma-separated list (one URL per
/// cluster node): the first that answers is used.
///
/// # Panics
/// When RabbitMQ does not answer at `url`.
pub async fn connect(url: &str, name: &str) -> Connection {
    connect_any(url, name)
        .await
        .unwrap_or_else(|e| panic!("{}", urls::unreachable("RabbitMQ", url, &e)))
}

/// A connection named `name` to the first URL of the comma-separated list
/// `urls` that answers within 5 s, or the last error.
///
/// # Errors
/// When no URL answers (with a single URL, its error).
pub async fn connect_any(urls: &str, name: &str) -> Result<Connection, lapin::Error> {
    let mut last = lapin::Error::from(lapin::ErrorKind::InvalidConnectionState(
        lapin::ConnectionState::Closed,
    ));
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        match tokio::time::timeout(
            std::time::Duration::from_secs(5),
            Connection::connect(url, properties),
        )
        .await
        {
            Ok(Ok(connection)) => return Ok(connection),
            Ok(Err(error)) => last = error,
            Err(_) => {
                last = lapin::Error::from(lapin::ErrorKind::IOError(std::sync::Arc::new(
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{url}: no answer in 5 s"),
                    ),
                )));
            }
        }
    }
    Err(last)
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
