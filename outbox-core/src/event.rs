//! The [`DomainEvent`] trait: what an application event tells the outbox about itself.

use serde::Serialize;

/// An application event that can be recorded in the outbox.
///
/// Usually derived with `#[derive(DomainEvent)]` (feature `derive`), but every
/// method can be written by hand. The methods take `&self` (rather than being
/// associated constants) so an `enum` can give one event type per variant; the
/// derive additionally emits associated constants (`AGGREGATE_TYPE`,
/// `EVENT_TYPE`, `SCHEMA_VERSION`) on structs for use in routing configuration.
///
/// The payload that is stored and published is the event's `serde`
/// serialization as JSON.
///
/// ```
/// use outbox_core::DomainEvent;
/// use serde::Serialize;
///
/// #[derive(Serialize)]
/// struct OrderPlaced {
///     order_id: u64,
///     total_cents: i64,
/// }
///
/// impl DomainEvent for OrderPlaced {
///     fn aggregate_type(&self) -> &'static str {
///         "order"
///     }
///     fn event_type(&self) -> &'static str {
///         "order.placed"
///     }
///     fn aggregate_id(&self) -> String {
///         self.order_id.to_string()
///     }
/// }
///
/// let event = OrderPlaced { order_id: 7, total_cents: 1250 };
/// assert_eq!(event.schema_version(), 1);
/// assert_eq!(event.aggregate_version(), None);
/// ```
pub trait DomainEvent: Serialize {
    /// The kind of aggregate (entity) the event belongs to, e.g. `"order"`.
    fn aggregate_type(&self) -> &'static str;

    /// The event's type, e.g. `"order.placed"`. Used as the default routing key,
    /// so dotted names route naturally on a topic exchange.
    fn event_type(&self) -> &'static str;

    /// The version of this event type's payload schema. Defaults to `1`.
    fn schema_version(&self) -> i32 {
        1
    }

    /// The id of the aggregate instance the event belongs to. Events of one
    /// aggregate (same type and id) are published in the order they were recorded.
    fn aggregate_id(&self) -> String;

    /// The aggregate's version after this event, if the application tracks one.
    fn aggregate_version(&self) -> Option<i64> {
        None
    }
}

impl<E: DomainEvent + ?Sized> DomainEvent for &E {
    fn aggregate_type(&self) -> &'static str {
        (**self).aggregate_type()
    }
    fn event_type(&self) -> &'static str {
        (**self).event_type()
    }
    fn schema_version(&self) -> i32 {
        (**self).schema_version()
    }
    fn aggregate_id(&self) -> String {
        (**self).aggregate_id()
    }
    fn aggregate_version(&self) -> Option<i64> {
        (**self).aggregate_version()
    }
}
