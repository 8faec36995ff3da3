//! The `order` aggregate: placing an order (with its validation), and the
//! status machine behind paying, cancelling and rejecting it.
//!
//! ```text
//!            pay              cancel
//!  placed ────────▶ paid ───────────────▶ cancelled
//!    │  └──────────────────── cancel ──────▲
//!    └── inventory.rejected ──▶ rejected
//! ```
//!
//! Each transition returns the event it raises; the caller persists the new
//! state and records the event in the same transaction.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use super::UnknownStatus;
use super::events::{LineItem, OrderCancelled, OrderPaid, OrderPlaced};
use super::inventory::is_valid_sku;

/// Where an order is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    /// Placed, not yet paid.
    Placed,
    /// Paid.
    Paid,
    /// Cancelled by the customer (from `placed` or `paid`).
    Cancelled,
    /// Rejected by the inventory (from `placed` only).
    Rejected,
}

impl OrderStatus {
    /// The name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Placed => "placed",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Rejected => "rejected",
        }
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OrderStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "placed" => Ok(OrderStatus::Placed),
            "paid" => Ok(OrderStatus::Paid),
            "cancelled" => Ok(OrderStatus::Cancelled),
            "rejected" => Ok(OrderStatus::Rejected),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

/// Why an order cannot be placed (the API answers `422`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidOrder {
    /// No lines.
    #[error("an order needs at least one item")]
    NoItems,
    /// A SKU that is empty, too long or has characters other than ASCII
    /// letters, digits, `-`, `_` and `.`.
    #[error(
        "item {line}: sku {sku:?} is not valid (1 to 64 ASCII letters, digits, '-', '_' or '.')"
    )]
    Sku {
        /// Index of the line.
        line: usize,
        /// The SKU given.
        sku: String,
    },
    /// A quantity below 1.
    #[error("item {line} ({sku}): quantity must be at least 1, got {quantity}")]
    Quantity {
        /// Index of the line.
        line: usize,
        /// Its SKU.
        sku: String,
        /// The quantity given.
        quantity: i64,
    },
    /// A negative price.
    #[error("item {line} ({sku}): unit_price_cents must not be negative, got {price}")]
    Price {
        /// Index of the line.
        line: usize,
        /// Its SKU.
        sku: String,
        /// The price given.
        price: i64,
    },
    /// The same SKU on two lines.
    #[error("sku {0:?} appears more than once; put the whole quantity on one line")]
    DuplicateSku(String),
    /// The total does not fit in 64 bits.
    #[error("the order total is too large")]
    TotalTooLarge,
}

/// A transition the order's status does not allow (the API answers `409`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("order {order_id} is {status}; {rule}")]
pub struct StatusConflict {
    /// The order.
    pub order_id: Uuid,
    /// Its current status.
    pub status: OrderStatus,
    /// What the transition needs.
    pub rule: &'static str,
}

/// An order: the aggregate root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// Its id (UUID v7: time-ordered, so inserts stay at the end of the index).
    pub id: Uuid,
    /// Who placed it.
    pub customer_id: Uuid,
    /// Where it is in its life.
    pub status: OrderStatus,
    /// Σ quantity × unit price, in cents.
    pub total_cents: i64,
    /// Its lines, in the order they were placed; never change.
    pub items: Vec<LineItem>,
}

impl Order {
    /// Places a new order: validates the lines, computes the total, and
    /// returns the order with its `order.placed` event.
    ///
    /// # Errors
    /// [`InvalidOrder`] saying which line is wrong.
    pub fn place(
        customer_id: Uuid,
        items: Vec<LineItem>,
    ) -> Result<(Order, OrderPlaced), InvalidOrder> {
        if items.is_empty() {
            return Err(InvalidOrder::NoItems);
        }
        let mut seen = HashSet::with_capacity(items.len());
        let mut total: i64 = 0;
        for (line, item) in items.iter().enumerate() {
            if !is_valid_sku(&item.sku) {
                return Err(InvalidOrder::Sku {
                    line,
                    sku: item.sku.clone(),
                });
            }
            if item.quantity < 1 {
                return Err(InvalidOrder::Quantity {
                    line,
                    sku: item.sku.clone(),
                    quantity: item.quantity,
                });
            }
            if item.unit_price_cents < 0 {
                return Err(InvalidOrder::Price {
                    line,
                    sku: item.sku.clone(),
                    price: item.unit_price_cents,
                });
            }
            if !seen.insert(item.sku.as_str()) {
                return Err(InvalidOrder::DuplicateSku(item.sku.clone()));
            }
            total = item
                .quantity
                .checked_mul(item.unit_price_cents)
                .and_then(|line_total| total.checked_add(line_total))
                .ok_or(InvalidOrder::TotalTooLarge)?;
        }
        let order = Order {
            id: Uuid::now_v7(),
            customer_id,
            status: OrderStatus::Placed,
            total_cents: total,
            items,
        };
        let event = OrderPlaced {
            order_id: order.id,
            customer_id: order.customer_id,
            total_cents: order.total_cents,
            items: order.items.clone(),
        };
        Ok((order, event))
    }

    /// Pays a placed order.
    ///
    /// # Errors
    /// [`StatusConflict`] unless the order is `placed`.
    pub fn pay(&mut self) -> Result<OrderPaid, StatusConflict> {
        if self.status != OrderStatus::Placed {
            return Err(self.conflict("only placed orders can be paid"));
        }
        self.status = OrderStatus::Paid;
        Ok(OrderPaid {
            order_id: self.id,
            customer_id: self.customer_id,
            total_cents: self.total_cents,
        })
    }

    /// Cancels a placed or paid order.
    ///
    /// # Errors
    /// [`StatusConflict`] if the order is already `cancelled` or `rejected`.
    pub fn cancel(&mut self) -> Result<OrderCancelled, StatusConflict> {
        let was_paid = match self.status {
            OrderStatus::Placed => false,
            OrderStatus::Paid => true,
            OrderStatus::Cancelled | OrderStatus::Rejected => {
                return Err(self.conflict("only placed or paid orders can be cancelled"));
            }
        };
        self.status = OrderStatus::Cancelled;
        Ok(OrderCancelled {
            order_id: self.id,
            customer_id: self.customer_id,
            total_cents: self.total_cents,
            was_paid,
        })
    }

    /// Rejects the order because the inventory cannot serve it. Only a
    /// `placed` order becomes `rejected`; returns whether it did (a paid or
    /// cancelled order keeps its status).
    pub fn reject(&mut self) -> bool {
        if self.status == OrderStatus::Placed {
            self.status = OrderStatus::Rejected;
            true
        } else {
            false
        }
    }

    fn conflict(&self, rule: &'static str) -> StatusConflict {
        StatusConflict {
            order_id: self.id,
            status: self.status,
            rule,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(sku: &str, quantity: i64, unit_price_cents: i64) -> LineItem {
        LineItem {
            sku: sku.into(),
            quantity,
            unit_price_cents,
        }
    }

    #[test]
    fn placing_computes_the_total_and_raises_order_placed() {
        let customer = Uuid::now_v7();
        let items = vec![item("mug", 2, 250), item("tea-1kg", 1, 1999)];
        let (order, event) = Order::place(customer, items.clone()).unwrap();
        assert_eq!(order.status, OrderStatus::Placed);
        assert_eq!(order.total_cents, 2499);
        assert_eq!(event.order_id, order.id);
        assert_eq!(event.customer_id, customer);
        assert_eq!(event.total_cents, 2499);
        assert_eq!(event.items, items);
    }

    #[test]
    fn invalid_orders_say_what_is_wrong() {
        let c = Uuid::nil();
        assert_eq!(Order::place(c, vec![]).unwrap_err(), InvalidOrder::NoItems);
        assert!(matches!(
            Order::place(c, vec![item("mug", 0, 1)]).unwrap_err(),
            InvalidOrder::Quantity { quantity: 0, .. }
        ));
        assert!(matches!(
            Order::place(c, vec![item("mug", 1, -1)]).unwrap_err(),
            InvalidOrder::Price { price: -1, .. }
        ));
        assert_eq!(
            Order::place(c, vec![item("mug", 1, 1), item("mug", 2, 1)]).unwrap_err(),
            InvalidOrder::DuplicateSku("mug".into())
        );
        assert!(matches!(
            Order::place(c, vec![item("", 1, 1)]).unwrap_err(),
            InvalidOrder::Sku { line: 0, .. }
        ));
        assert_eq!(
            Order::place(c, vec![item("a", i64::MAX, 2)]).unwrap_err(),
            InvalidOrder::TotalTooLarge
        );
        // A free item is fine.
        assert_eq!(
            Order::place(c, vec![item("sticker", 1, 0)])
                .unwrap()
                .0
                .total_cents,
            0
        );
    }

    #[test]
    fn the_status_machine() {
        let (mut order, _) = Order::place(Uuid::nil(), vec![item("mug", 1, 100)]).unwrap();
        let paid = order.pay().unwrap();
        assert_eq!(paid.total_cents, 100);
        assert_eq!(order.status, OrderStatus::Paid);
        assert_eq!(order.pay().unwrap_err().status, OrderStatus::Paid);
        assert!(!order.reject(), "a paid order is not rejected");
        let cancelled = order.cancel().unwrap();
        assert!(cancelled.was_paid);
        assert_eq!(order.status, OrderStatus::Cancelled);
        assert!(order.cancel().is_err());
        assert!(order.pay().is_err());

        let (mut order, _) = Order::place(Uuid::nil(), vec![item("mug", 1, 100)]).unwrap();
        assert!(order.reject());
        assert_eq!(order.status, OrderStatus::Rejected);
        assert!(order.cancel().is_err());
        assert!(order.pay().is_err());
        assert!(!order.reject());

        let (mut order, _) = Order::place(Uuid::nil(), vec![item("mug", 1, 100)]).unwrap();
        assert!(!order.cancel().unwrap().was_paid);
    }

    #[test]
    fn status_names_round_trip() {
        for status in [
            OrderStatus::Placed,
            OrderStatus::Paid,
            OrderStatus::Cancelled,
            OrderStatus::Rejected,
        ] {
            assert_eq!(status.as_str().parse::<OrderStatus>().unwrap(), status);
        }
        assert!("shipped".parse::<OrderStatus>().is_err());
    }
}
