//! Events the end-to-end tests record, derived through the facade as an
//! application would.

use outbox::DomainEvent;
use serde::Serialize;
use uuid::Uuid;

/// An order was placed: aggregate `order`, event type `order.placed`.
#[derive(Debug, Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
pub struct OrderPlaced {
    /// The order (the aggregate id).
    #[aggregate_id]
    pub order_id: Uuid,
    /// Its total.
    pub total_cents: i64,
}
