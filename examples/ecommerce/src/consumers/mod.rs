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
//! Every handler is strict about what it accepts: an event type it does
//! not handle ([`unknown_event_type`]) or a schema version it does not read
//! ([`payload`]) is a permanent failure, so the message lands in the
//! queue's dead-letter queue with the reason in `x-outbox-dead-reason`
//! instead of being acknowledged as processed; the inbox does not record it
//! (the transaction rolls back), so a replay from the dead-letter queue
//! after a fix is handled normally.
//!
//! Handlers also tolerate events arriving out of order (a failed delivery is
//! retried behind later ones): each keeps a per-order record (a reservation,
//! a loyalty award) that a late event consults, so e.g. an `order.placed`
//! arriving after its `order.cancelled` reserves nothing.

pub mod inventory;
pub mod loyalty;
pub mod orders;

use outbox::postgres::Transaction;
use outbox::rabbitmq::{EventHandler, HandlerError, InboxConsumer, IncomingEvent, QueueTopology};
use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::db::{Database, DbPool};

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
pub fn build<C: Database, H: EventHandler<Transaction<C>>>(
    config: &Config,
    pool: DbPool<C>,
    name: &str,
    topology: QueueTopology,
    handler: H,
) -> Result<InboxConsumer<C::Inbox, H>, outbox::rabbitmq::Error> {
    let queue = topology.queue_name().to_owned();
    InboxConsumer::builder(&config.amqp_url, queue, name, C::inbox(pool), handler)
        .declare(topology)
        .concurrency(CONCURRENCY)
        .prefetch(PREFETCH)
        .build()
}

/// The payload of `event` as `T`, whose schema is version `version` of the
/// event type (the derive's `SCHEMA_VERSION`). An event of another schema
/// version, or a payload that does not parse, will never be handled: the
/// error is permanent, so the message goes to the dead-letter queue at once
/// (with the reason in `x-outbox-dead-reason`) and the transaction, inbox
/// entry included, rolls back.
///
/// # Errors
/// A permanent [`HandlerError`]: `unsupported schema_version N of X
/// (supported: V)`, or the JSON error.
pub fn payload<T: DeserializeOwned>(
    event: &IncomingEvent,
    version: i32,
) -> Result<T, HandlerError> {
    schema_version(event, version)?;
    event.payload_as().map_err(|error| {
        HandlerError::permanent(format!(
            "{} payload does not match its schema: {error}",
            event.event_type
        ))
    })
}

/// `Ok` when `event` has schema version `version`, the one this consumer
/// reads; see [`payload`].
///
/// # Errors
/// A permanent [`HandlerError`]: `unsupported schema_version N of X
/// (supported: V)`.
pub fn schema_version(event: &IncomingEvent, version: i32) -> Result<(), HandlerError> {
    if event.schema_version == version {
        Ok(())
    } else {
        Err(HandlerError::permanent(format!(
            "unsupported schema_version {} of {} (supported: {version})",
            event.schema_version, event.event_type
        )))
    }
}

/// The error for an event type `consumer` does not handle. Such an event was
/// misrouted, or comes from a producer newer than this consumer (the orders
/// queue binds `inventory.*`): acknowledging it as processed would lose it
/// silently. The error is permanent: the message goes to the dead-letter
/// queue with the reason, and the inbox does not record it.
pub fn unknown_event_type(consumer: &str, event: &IncomingEvent) -> HandlerError {
    HandlerError::permanent(format!(
        "unknown event type {} for consumer {consumer}",
        event.event_type
    ))
}

#[cfg(test)]
mod tests {
    use outbox::EventEnvelope;
    use outbox::rabbitmq::wire;
    use serde::Deserialize;
    use uuid::Uuid;

    use super::*;
    use crate::domain::OrderPaid;

    /// An event as a consumer receives it, with the given type, schema
    /// version and payload.
    fn event(event_type: &str, schema_version: i32, payload: &str) -> IncomingEvent {
        let mut envelope = EventEnvelope::from_event(&OrderPaid {
            order_id: Uuid::now_v7(),
            customer_id: Uuid::now_v7(),
            total_cents: 5,
        })
        .unwrap();
        envelope.event_type = event_type.into();
        envelope.schema_version = schema_version;
        let properties = wire::properties(&envelope, "/test");
        wire::decode(&properties, event_type, payload.as_bytes()).unwrap()
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Paid {
        total_cents: i64,
    }

    #[test]
    fn a_supported_version_parses() {
        let paid: Paid = payload(&event("order.paid", 1, r#"{"total_cents":5}"#), 1).unwrap();
        assert_eq!(paid, Paid { total_cents: 5 });
        assert!(schema_version(&event("order.paid", 1, "{}"), 1).is_ok());
    }

    #[test]
    fn another_version_is_a_permanent_error_naming_both() {
        for version in [0, 2, -1] {
            let incoming = event("order.paid", version, r#"{"total_cents":5}"#);
            let err = payload::<Paid>(&incoming, 1).unwrap_err();
            assert!(err.is_permanent());
            assert_eq!(
                err.to_string(),
                format!("unsupported schema_version {version} of order.paid (supported: 1)")
            );
        }
    }

    #[test]
    fn a_payload_of_the_wrong_shape_is_a_permanent_error() {
        let err = payload::<Paid>(&event("order.paid", 1, r#"{"total":5}"#), 1).unwrap_err();
        assert!(err.is_permanent());
        assert!(
            err.to_string()
                .starts_with("order.paid payload does not match its schema: "),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_event_type_is_a_permanent_error_naming_the_consumer() {
        let err = unknown_event_type("loyalty", &event("order.shipped", 1, "{}"));
        assert!(err.is_permanent());
        assert_eq!(
            err.to_string(),
            "unknown event type order.shipped for consumer loyalty"
        );
    }
}
