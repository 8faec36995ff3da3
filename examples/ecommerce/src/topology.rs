//! The RabbitMQ topology: the exchange every event goes to, and the queues
//! of the three consumers with their bindings and dead-letter queues.
//!
//! ```text
//!                        ┌─ order.placed, order.cancelled ─▶ <prefix>.inventory
//!  EXCHANGE (topic) ─────┼─ order.paid, order.cancelled ───▶ <prefix>.loyalty
//!                        └─ inventory.* ───────────────────▶ <prefix>.orders
//!  each <queue> dead-letters to <queue>.dlx ──▶ <queue>.dead
//! ```
//!
//! Every role declares all of it at start (idempotently), so no event is
//! unroutable because the role that consumes it started late: the queue
//! exists, and keeps the event, from the first start of any role.

use lapin::ExchangeKind;
use outbox::rabbitmq::{AmqpUrls, Error, QueueTopology, declare_exchange};

use crate::config::Config;
use crate::domain::{OrderCancelled, OrderPaid, OrderPlaced};

/// The `cloudEvents:source` of every message this service publishes.
pub const SOURCE: &str = "/ecommerce";

/// `<prefix>.inventory`: stock reservations.
pub fn inventory_queue(config: &Config) -> QueueTopology {
    QueueTopology::new(config.queue("inventory"))
        .exchange(&config.exchange)
        .bind(OrderPlaced::EVENT_TYPE)
        .bind(OrderCancelled::EVENT_TYPE)
}

/// `<prefix>.loyalty`: points.
pub fn loyalty_queue(config: &Config) -> QueueTopology {
    QueueTopology::new(config.queue("loyalty"))
        .exchange(&config.exchange)
        .bind(OrderPaid::EVENT_TYPE)
        .bind(OrderCancelled::EVENT_TYPE)
}

/// `<prefix>.orders`: the orders service hears back from the inventory.
pub fn orders_queue(config: &Config) -> QueueTopology {
    QueueTopology::new(config.queue("orders"))
        .exchange(&config.exchange)
        .bind("inventory.*")
}

/// Every queue of the service.
pub fn queues(config: &Config) -> [QueueTopology; 3] {
    [
        inventory_queue(config),
        loyalty_queue(config),
        orders_queue(config),
    ]
}

/// Declares the exchange and every queue, binding and dead-letter queue.
///
/// # Errors
/// [`Error::Connect`] (or [`Error::Unreachable`] for a list of nodes) when
/// RabbitMQ is unreachable (naming the URL and `scripts/dev-services`),
/// [`Error::Amqp`] when a declaration is refused.
pub async fn declare(config: &Config) -> Result<(), Error> {
    // `AMQP_URL` may list every node of a cluster, comma-separated.
    let connection = AmqpUrls::from(&config.amqp_url)
        .connect("ecommerce-topology")
        .await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|source| Error::Amqp {
            operation: "open a channel".into(),
            source,
        })?;
    declare_exchange(&channel, &config.exchange, ExchangeKind::Topic).await?;
    for queue in queues(config) {
        queue.declare(&channel).await?;
    }
    if let Err(error) = connection.close(200, "OK".into()).await {
        tracing::debug!(%error, "closing the topology connection");
    }
    tracing::info!(exchange = %config.exchange, prefix = %config.queue_prefix, "topology declared");
    Ok(())
}
