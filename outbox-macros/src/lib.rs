//! `#[derive(DomainEvent)]` for the [`outbox`] transactional outbox.
//!
//! Use it through the `outbox` crate (feature `derive`, on by default), where
//! `use outbox::DomainEvent;` brings in both the trait and the derive:
//!
//! ```rust
//! use outbox::DomainEvent;
//! use serde::Serialize;
//! use uuid::Uuid;
//!
//! #[derive(Serialize, DomainEvent)]
//! #[domain_event(aggregate = "order")]
//! struct OrderPlaced {
//!     #[aggregate_id]
//!     order_id: Uuid,
//!     #[aggregate_version]
//!     version: i64,
//!     total_cents: i64,
//! }
//!
//! let order_id = Uuid::nil();
//! let event = OrderPlaced { order_id, version: 3, total_cents: 1250 };
//! assert_eq!(event.aggregate_type(), "order");
//! assert_eq!(event.event_type(), "order.placed"); // the default name
//! assert_eq!(event.schema_version(), 1);
//! assert_eq!(event.aggregate_id(), order_id.to_string());
//! assert_eq!(event.aggregate_version(), Some(3));
//!
//! // The same values as constants, e.g. for routing configuration.
//! assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
//! assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
//! assert_eq!(OrderPlaced::SCHEMA_VERSION, 1);
//! ```
//!
//! The event's payload is its `serde` serialization: the derive only adds the
//! metadata (aggregate, event type, schema version, aggregate id and version).
//!
//! # Attributes
//!
//! | Attribute | Written on | Value | Meaning |
//! |---|---|---|---|
//! | `#[domain_event(aggregate = "...")]` | struct, enum | string, **required** | [`aggregate_type`]: the kind of entity the event belongs to, e.g. `"order"`. |
//! | `#[domain_event(event_type = "...")]` | struct, enum variant | string | [`event_type`]. Default: see [Default event type](#default-event-type). |
//! | `#[domain_event(version = N)]` | struct, enum, enum variant | integer literal, `1..=2147483647`; default `1` | [`schema_version`]. On an enum it is the default of its variants, which may override it. |
//! | `#[domain_event(crate = "path")]` | struct, enum | string holding a path | Where the `DomainEvent` trait is, e.g. `"my_outbox"` or `"::my_app::outbox"`. Default: see [Crate path](#crate-path). |
//! | `#[aggregate_id]` | field | none | [`aggregate_id`] is the field's `to_string()`. Exactly one per struct, and per enum variant. The type must implement `Display` (`Uuid`, integers, `String`, `&str`, ...). |
//! | `#[aggregate_version]` | field | none | [`aggregate_version`] is `Some(field.clone().into())`. At most one per struct or variant. The type must implement `Clone + Into<i64>`: `i8` to `i64`, `u8` to `u32`. `u64`, `usize` and `i128` do not convert losslessly and are rejected by the compiler; store an `i64`. Without the attribute it is `None`. |
//!
//! Keys may be spread over several `#[domain_event(...)]` attributes, but each
//! key may be given only once. `aggregate` and `event_type` must be non-empty,
//! at most 255 bytes (AMQP short strings) and use only ASCII letters, digits,
//! `_`, `.` and `-` (so they are safe as AMQP routing keys and metric labels).
//!
//! # Default event type
//!
//! Without `event_type`, the event type is `<aggregate>.<name in snake_case>`,
//! where the name is the struct's (or variant's) name with a leading aggregate
//! name dropped. The aggregate is compared in its PascalCase form
//! (`order_line` → `OrderLine`), ignoring case, and only as a whole word; a name
//! that *is* the aggregate name is kept.
//!
//! | `aggregate` | Struct or variant | Event type |
//! |---|---|---|
//! | `order` | `OrderPlaced` | `order.placed` |
//! | `order_line` | `OrderLineAdded` | `order_line.added` |
//! | `order` | `PaymentCaptured` | `order.payment_captured` |
//! | `order` | `Order` | `order.order` |
//! | `order` | `Orderly` | `order.orderly` |
//! | `order` | variant `Placed` | `order.placed` |
//!
//! # Generated items
//!
//! Besides `impl DomainEvent`, the derive adds documented inherent constants:
//!
//! - on a struct: `AGGREGATE_TYPE: &'static str`, `EVENT_TYPE: &'static str`
//!   and `SCHEMA_VERSION: i32`;
//! - on an enum: `AGGREGATE_TYPE: &'static str` and
//!   `EVENT_TYPES: &'static [&'static str]`, the event types of all variants in
//!   declaration order.
//!
//! # Enums
//!
//! Each variant of an enum is one event type. `aggregate` (and optionally
//! `version` and `crate`) is set on the enum; `event_type` and `version` may be
//! set on a variant. Every variant needs exactly one `#[aggregate_id]` field,
//! so unit variants are rejected, and no two variants may have the same event
//! type.
//!
//! The payload is the variant serialized the way `serde` is configured for the
//! enum. The event type already travels with the message (in its metadata and
//! routing key), so repeating the variant name in the payload, as serde's
//! default externally tagged form `{"Placed":{...}}` or `#[serde(tag = "...")]`
//! do, is redundant. **`#[serde(untagged)]` is recommended**: the payload is
//! then just the variant's fields, exactly what a struct event with the same
//! fields gives, and consumers deserialize it into the type the event type
//! names.
//!
//! ```rust
//! use outbox::DomainEvent;
//! use serde::Serialize;
//!
//! #[derive(Serialize, DomainEvent)]
//! #[serde(untagged)]
//! #[domain_event(aggregate = "order", version = 2)]
//! enum OrderEvent {
//!     Placed {
//!         #[aggregate_id]
//!         order_id: u64,
//!         total_cents: i64,
//!     },
//!     #[domain_event(event_type = "order.cancelled.v1", version = 1)]
//!     Cancelled {
//!         #[aggregate_id]
//!         order_id: u64,
//!     },
//!     Shipped(#[aggregate_id] u64, String),
//! }
//!
//! let placed = OrderEvent::Placed { order_id: 7, total_cents: 1250 };
//! assert_eq!(placed.event_type(), "order.placed");
//! assert_eq!(placed.schema_version(), 2);
//! assert_eq!(placed.aggregate_id(), "7");
//! assert_eq!(
//!     serde_json::to_string(&placed).unwrap(),
//!     r#"{"order_id":7,"total_cents":1250}"#,
//! );
//!
//! let cancelled = OrderEvent::Cancelled { order_id: 7 };
//! assert_eq!(cancelled.event_type(), "order.cancelled.v1");
//! assert_eq!(cancelled.schema_version(), 1);
//!
//! let shipped = OrderEvent::Shipped(7, "DHL".to_owned());
//! assert_eq!(shipped.event_type(), "order.shipped");
//! assert_eq!(serde_json::to_string(&shipped).unwrap(), r#"[7,"DHL"]"#);
//!
//! assert_eq!(OrderEvent::AGGREGATE_TYPE, "order");
//! assert_eq!(
//!     OrderEvent::EVENT_TYPES,
//!     ["order.placed", "order.cancelled.v1", "order.shipped"],
//! );
//! ```
//!
//! # Tuple structs and generics
//!
//! `#[aggregate_id]` may mark a positional field. Generic types and lifetimes
//! are supported: the impl has the type's own generics and `where` clause, so
//! bounds the impl needs (`Serialize`, which `DomainEvent` requires, and
//! `Display` for a generic `#[aggregate_id]` field) belong on the type.
//!
//! ```rust
//! use std::fmt::Display;
//!
//! use outbox::DomainEvent;
//! use serde::Serialize;
//!
//! #[derive(Serialize, DomainEvent)]
//! #[domain_event(aggregate = "customer", event_type = "customer.renamed")]
//! struct CustomerRenamed<'a>(#[aggregate_id] &'a str, &'a str);
//!
//! #[derive(Serialize, DomainEvent)]
//! #[domain_event(aggregate = "account")]
//! struct Credited<Id: Serialize + Display> {
//!     #[aggregate_id]
//!     account: Id,
//!     cents: i64,
//! }
//!
//! assert_eq!(CustomerRenamed("c-1", "Ada").aggregate_id(), "c-1");
//! assert_eq!(Credited { account: 42_u32, cents: 5 }.event_type(), "account.credited");
//! ```
//!
//! # Crate path
//!
//! The generated impl names the trait by an absolute path, found in the
//! `Cargo.toml` of the crate using the derive: `::outbox` if it depends on
//! `outbox` (under its renamed name if renamed), otherwise `::outbox_core` if it
//! depends on `outbox-core`, otherwise `::outbox`. When the trait is reached
//! some other way, e.g. through a re-export, give its crate with
//! `#[domain_event(crate = "...")]`:
//!
//! ```rust
//! # use serde::Serialize;
//! mod events {
//!     pub use outbox::DomainEvent;
//! }
//! use events::DomainEvent;
//!
//! #[derive(Serialize, DomainEvent)]
//! #[domain_event(aggregate = "order", crate = "crate::events")]
//! struct OrderPlaced {
//!     #[aggregate_id]
//!     order_id: u64,
//! }
//! # fn main() {
//! #     assert_eq!(OrderPlaced { order_id: 1 }.event_type(), "order.placed");
//! # }
//! ```
//!
//! # Errors
//!
//! Mistakes are reported at the token that is wrong, and all of them in one
//! compile: unknown or duplicate keys, values of the wrong type, empty or
//! ill-formed names, versions below 1, a missing or repeated `#[aggregate_id]`,
//! unit structs, unit variants, unions and duplicate event types among variants.
//!
//! [`outbox`]: https://docs.rs/outbox
//! [`aggregate_type`]: https://docs.rs/outbox-core/latest/outbox_core/trait.DomainEvent.html#tymethod.aggregate_type
//! [`event_type`]: https://docs.rs/outbox-core/latest/outbox_core/trait.DomainEvent.html#tymethod.event_type
//! [`schema_version`]: https://docs.rs/outbox-core/latest/outbox_core/trait.DomainEvent.html#method.schema_version
//! [`aggregate_id`]: https://docs.rs/outbox-core/latest/outbox_core/trait.DomainEvent.html#tymethod.aggregate_id
//! [`aggregate_version`]: https://docs.rs/outbox-core/latest/outbox_core/trait.DomainEvent.html#method.aggregate_version

mod attr;
mod case;
mod crate_path;
mod ctxt;
mod expand;
mod model;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives `DomainEvent` (from `outbox` / `outbox-core`) for a struct or enum.
///
/// See the [crate documentation](crate) for the attributes, the default event
/// type and examples.
#[proc_macro_derive(DomainEvent, attributes(domain_event, aggregate_id, aggregate_version))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
