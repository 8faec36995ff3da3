//! The event consumers, one per queue, each an [`EventHandler`] run by an
//! [`InboxConsumer`]: the consumer records the event id in the inbox and
//! runs the handler in the same transaction, then acknowledges after the
//! commit. A redelivered event (a crash before the ack, a relay publishing
//! again after a crash) is found in the inbox and skipped: effects happen
//! exactly once.
//!
//! | consumer (inbox name) | queue | binds | role |
//! |---|---|---|---|
//! | [`inventory::Inventory`] (`inventory`) | `<prefix>.inventory` | `order.placed`, `order.cancelled` | `inventory` |
//! | [`loyalty::Loyalty`] (`loyalty`) | `<prefix>.loyalty` | `order.paid`, `order.cancelled` | `loyalty` |
//! | [`orders::Orders`] (`orders`) | `<prefix>.orders` | `inventory.*` | `api` |
//!
//! Each queue carries the events of one producer: `order.*` from the API,
//! `inventory.*` from the inventory. Both producers lock what they change
//! (the order's row; the order's reservation), so within a queue the events
//! of one order arrive in the order they were committed. The two producers
//! do not lock each other's rows (they would not share a database in
//! production), so nothing here relies on the relative order of an order's
//! `order.*` and `inventory.*` events.
//!
//! Handlers also tolerate events arriving out of order (a failed delivery is
//! retried behind later ones): each keeps a per-order record (a reservation,
//! a loyalty award) that a late event consults, so e.g. an `order.placed`
//! arriving after its `order.cancelled` reserves nothing.

pub mod inventory;
pub mod loyalty;
pub mod orders;

use outbox::postgres::{PgInbox, PgInboxDatabase, PgTransaction};
use outbox::rabbitmq::{EventHandler, HandlerError, InboxConsumer, IncomingEvent, QueueTopology};
use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::db::PgPool;

/// Deliveries handled at once per consumer. Events of one order always go
/// to the same worker, in queue order; different orders run in parallel.
pub const CONCURRENCY: usize = 4;

/// Unacknowledged deliveries the broker sends ahead.
pub const PREFETCH: u16 = 32;

/// A consumer of `topology`'s queue (declared again on each connect) named
/// `name` in the inbox, running `handler` in transactions on `pool`.
///
/// # Errors
/// [`outbox::rabbitmq::Error::Config`] for invalid names.
pub fn build<H: EventHandler<PgTransaction>>(
    config: &Config,
    pool: PgPool,
    name: &str,
    topology: QueueTopology,
    handler: H,
) -> Result<InboxConsumer<PgInboxDatabase, H>, outbox::rabbitmq::Error> {
    let queue = topology.queue_name().to_owned();
    InboxConsumer::builder(
        &config.amqp_url,
        queue,
        name,
        PgInboxDatabase::new(pool, PgInbox::default()),
        handler,
    )
    .declare(topology)
    .concurrency(CONCURRENCY)
    .prefetch(PREFETCH)
    .build()
}

/// The payload of `event` as `T`. One that does not parse never will: the
/// error is permanent, so the message goes to the dead-letter queue at once.
///
/// # Errors
/// A permanent [`HandlerError`] with the JSON error.
pub fn payload<T: DeserializeOwned>(event: &IncomingEvent) -> Result<T, HandlerError> {
    event.payload_as().map_err(|error| {
        HandlerError::permanent(format!(
            "{} payload does not match its schema: {error}",
            event.event_type
        ))
    })
}
