//! The business rules, free of I/O: the order aggregate and its status
//! machine, the events on the wire, and the inventory and loyalty rules.
//! The `db` module persists what these decide; `routes` and `consumers`
//! drive them.

pub mod events;
pub mod inventory;
pub mod loyalty;
pub mod order;

pub use events::{
    InventoryRejected, InventoryReserved, LineItem, OrderCancelled, OrderPaid, OrderPlaced,
    ReservedItem,
};
pub use order::{InvalidOrder, Order, OrderStatus, StatusConflict};

/// A stored status name this code does not know (a newer version wrote it,
/// or the data is corrupt).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status `{0}`")]
pub struct UnknownStatus(pub String);
