//! The events of the service: what goes on the wire, field for field.
//!
//! Every event belongs to the `order` aggregate with the order id as its
//! aggregate id, so the relay publishes the events of one order in the order
//! they were recorded. The event type is the routing key on the topic
//! exchange (`order.placed`, `inventory.rejected`, ...), which is what the
//! queues bind to (see `topology`).
//!
//! Consumers deserialize the same types. They deliberately do **not** deny
//! unknown fields: a producer may add a field without breaking consumers
//! (a field is never removed or changed without a new `version`).

use outbox::DomainEvent;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One line of an order, as placed (`order.placed`) and as shown by the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineItem {
    /// Stock keeping unit.
    pub sku: String,
    /// How many, at least 1.
    pub quantity: i64,
    /// Price of one, in cents.
    pub unit_price_cents: i64,
}

/// `order.placed`: a customer placed an order. The inventory reserves its items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "order")]
pub struct OrderPlaced {
    /// The order.
    #[aggregate_id]
    pub order_id: Uuid,
    /// Who placed it.
    pub customer_id: Uuid,
    /// Σ quantity × unit price.
    pub total_cents: i64,
    /// The lines, in the order they were placed.
    pub items: Vec<LineItem>,
}

/// `order.paid`: a placed order was paid. Loyalty awards points for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "order")]
pub struct OrderPaid {
    /// The order.
    #[aggregate_id]
    pub order_id: Uuid,
    /// Who paid.
    pub customer_id: Uuid,
    /// The amount paid.
    pub total_cents: i64,
}

/// `order.cancelled`: a placed or paid order was cancelled. The inventory
/// releases its stock; loyalty takes back the points of a paid one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "order")]
pub struct OrderCancelled {
    /// The order.
    #[aggregate_id]
    pub order_id: Uuid,
    /// Whose order.
    pub customer_id: Uuid,
    /// Its total.
    pub total_cents: i64,
    /// Whether it had been paid (and so earned points).
    pub was_paid: bool,
}

/// One reserved line of [`InventoryReserved`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservedItem {
    /// Stock keeping unit.
    pub sku: String,
    /// How many were moved from available to reserved.
    pub quantity: i64,
}

/// `inventory.reserved`: every item of the order is reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "order", event_type = "inventory.reserved")]
pub struct InventoryReserved {
    /// The order.
    #[aggregate_id]
    pub order_id: Uuid,
    /// What was reserved.
    pub items: Vec<ReservedItem>,
}

/// `inventory.rejected`: the order cannot be served (an unknown SKU, or not
/// enough stock); nothing was reserved. The orders service marks the order
/// `rejected`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "order", event_type = "inventory.rejected")]
pub struct InventoryRejected {
    /// The order.
    #[aggregate_id]
    pub order_id: Uuid,
    /// Why, for people (e.g. `insufficient stock for sku "mug": 3 ordered, 1 available`).
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn event_types_are_the_routing_keys_of_the_contract() {
        assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
        assert_eq!(OrderPaid::EVENT_TYPE, "order.paid");
        assert_eq!(OrderCancelled::EVENT_TYPE, "order.cancelled");
        assert_eq!(InventoryReserved::EVENT_TYPE, "inventory.reserved");
        assert_eq!(InventoryRejected::EVENT_TYPE, "inventory.rejected");
        for aggregate in [
            OrderPlaced::AGGREGATE_TYPE,
            OrderPaid::AGGREGATE_TYPE,
            OrderCancelled::AGGREGATE_TYPE,
            InventoryReserved::AGGREGATE_TYPE,
            InventoryRejected::AGGREGATE_TYPE,
        ] {
            assert_eq!(aggregate, "order");
        }
    }

    #[test]
    fn payloads_are_the_contract() {
        let order_id = Uuid::nil();
        let customer_id = Uuid::max();
        let placed = OrderPlaced {
            order_id,
            customer_id,
            total_cents: 500,
            items: vec![LineItem {
                sku: "mug".into(),
                quantity: 2,
                unit_price_cents: 250,
            }],
        };
        assert_eq!(placed.aggregate_id(), order_id.to_string());
        assert_eq!(
            serde_json::to_value(&placed).unwrap(),
            json!({
                "order_id": order_id, "customer_id": customer_id, "total_cents": 500,
                "items": [{"sku": "mug", "quantity": 2, "unit_price_cents": 250}],
            })
        );
        let cancelled = OrderCancelled {
            order_id,
            customer_id,
            total_cents: 500,
            was_paid: true,
        };
        assert_eq!(
            serde_json::to_value(&cancelled).unwrap(),
            json!({"order_id": order_id, "customer_id": customer_id, "total_cents": 500, "was_paid": true})
        );
        let reserved = InventoryReserved {
            order_id,
            items: vec![ReservedItem {
                sku: "mug".into(),
                quantity: 2,
            }],
        };
        assert_eq!(reserved.aggregate_id(), order_id.to_string());
        assert_eq!(
            serde_json::to_value(&reserved).unwrap(),
            json!({"order_id": order_id, "items": [{"sku": "mug", "quantity": 2}]})
        );
        let rejected = InventoryRejected {
            order_id,
            reason: "no".into(),
        };
        assert_eq!(
            serde_json::to_value(&rejected).unwrap(),
            json!({"order_id": order_id, "reason": "no"})
        );
    }

    #[test]
    fn consumers_tolerate_fields_added_later() {
        let paid: OrderPaid = serde_json::from_value(json!({
            "order_id": Uuid::nil(), "customer_id": Uuid::nil(), "total_cents": 1, "currency": "EUR",
        }))
        .unwrap();
        assert_eq!(paid.total_cents, 1);
    }
}
