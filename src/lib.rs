//! **outbox**: the transactional outbox (and inbox) for Rust services built on
//! Diesel, Axum and RabbitMQ.
//!
//! A service that changes its database and must tell other services about it
//! writes the event as a row **in the same transaction** as the business
//! change; a relay later publishes committed rows to the broker with publisher
//! confirms, and consumers drop duplicates with an inbox. Nothing is lost
//! when the process or the broker fails between the two, and nothing is
//! announced that rolled back.
//!
//! This crate is the one dependency an application adds: it re-exports
//! `outbox-core` (the vocabulary and the relay engine), the derive, and each
//! adapter behind a feature.
//!
//! ```
//! use outbox::{DomainEvent, EventEnvelope};
//! use serde::Serialize;
//!
//! #[derive(Serialize, DomainEvent)]
//! #[domain_event(aggregate = "order")]
//! struct OrderPlaced {
//!     #[aggregate_id]
//!     order_id: u64,
//!     total_cents: i64,
//! }
//!
//! assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
//! let event = OrderPlaced { order_id: 7, total_cents: 1250 };
//! assert_eq!(event.aggregate_id(), "7");
//!
//! // The row an adapter writes inside your transaction:
//! let envelope = EventEnvelope::from_event(&event)?;
//! assert_eq!(envelope.payload, r#"{"order_id":7,"total_cents":1250}"#);
//! # Ok::<(), outbox::Error>(())
//! ```
//!
//! # Feature flags
//! | feature | default | enables |
//! |---|---|---|
//! | `derive` | yes | `#[derive(DomainEvent)]` |
//! | `postgres` | no | `outbox::postgres` (`outbox-diesel`): PostgreSQL store, recording, inbox, on diesel-async (no libpq) |
//! | `postgres-sync` | no | `postgres`, and recording on a sync `diesel::PgConnection` (`Outbox::record_sync`; links libpq) |
//! | `postgres-tls` | no | TLS to PostgreSQL (rustls) honouring `sslmode` and `sslrootcert` in the URL; implies `postgres`. Without it, connections are plaintext and a URL asking for `require` or `verify-*` is refused |
//! | `mysql` | no | `outbox::mysql` (`outbox-diesel`'s `mysql` module): MariaDB recording, the relay store (with the admin API), the inbox, consumers' dead letters and migrations on diesel-async (mysql_async, pure Rust); MariaDB 10.6+ |
//! | `mysql-tls` | no | TLS to MariaDB (rustls with ring) for every connection `outbox::mysql` opens: `require_ssl`, `verify_ca`, `verify_identity`, `built_in_roots` and `ssl_ca=<PEM file>` in the URL; implies `mysql`. Without it, a URL asking for TLS is refused |
//! | `sqlite` | no | `outbox::sqlite` (`outbox-diesel`'s `sqlite` module): SQLite recording, inbox and migrations on diesel-async's `SyncConnectionWrapper` (SQLite compiled in, no system library; tokio's multi-thread runtime) |
//! | `axum` | no | `outbox::axum` (`outbox-axum`): the Tower layer; implies `postgres` |
//! | `rabbitmq` | no | `outbox::rabbitmq` (`outbox-lapin`): publisher with confirms, inbox consumer |
//! | `test-util` | no | `outbox::testing`: in-memory store and recording publisher |
//! | `failpoints` | no | named failpoints in the relay (`outbox::failpoints`) |
//! | `opentelemetry` | no | trace context from and to OpenTelemetry spans (`tracing-opentelemetry`): one order is one trace, see [Tracing](#tracing) and [`trace_context`] |
//!
//! # Tracing
//!
//! With the `opentelemetry` feature, and a `tracing-opentelemetry` layer in
//! the application's subscriber (the SDK and the exporter are the
//! application's choice; this crate depends on the `opentelemetry` API
//! crate only), one order is one trace. An event records the context of the
//! span that raised it; the relay publishes it in a `publish` span whose
//! parent is that context, and the inbox consumer handles it in a `process`
//! span whose parent is the `publish` span (or a new trace linked to it:
//! `rabbitmq::InboxConsumerBuilder::trace_links`), so the events a handler
//! records continue the trace:
//!
//! ```text
//! POST /orders                      the request's span (kind server), child of the caller's traceparent
//! │  events.raise(OrderPlaced)      the event records this span's context (traceparent, tracestate)
//! └─ publish shop.events            the relay, one span per message (producer), linked to its batch span;
//!    │                              the message carries this span's context
//!    └─ process shop.billing        the inbox consumer (consumer): the handler runs in it
//!       │  record(PaymentRequested) the chained event records this span's context
//!       └─ publish shop.events      the relay, the chained event
//!          └─ process shop.payments …
//! ```
//!
//! The relay's batch span (`send`) is a trace of its own (a batch holds
//! events of many traces), linked from each `publish` span. The spans follow the
//! OpenTelemetry messaging conventions (`messaging.system = rabbitmq`,
//! `messaging.destination.name`, `messaging.message.id` = the event id,
//! `messaging.message.conversation_id` = the correlation id). The request's
//! span is the application's: make it a child of the caller's context with
//! `outbox::trace_context::set_parent` over the request's `traceparent`,
//! `tracestate` and `baggage` headers (the example service's
//! `telemetry::request_span` does, in a tower-http `TraceLayer`). W3C
//! baggage is carried only when opted in (`trace_context::carry_baggage`,
//! capped). Malformed trace headers are dropped with a warning, never
//! forwarded. Without the feature nothing of OpenTelemetry is compiled: a
//! request's valid `traceparent` is still carried as text.
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

pub use outbox_core::*;

/// `#[derive(DomainEvent)]`; see the `outbox-macros` crate for attributes.
#[cfg(feature = "derive")]
pub use outbox_macros::DomainEvent;

/// PostgreSQL adapter (diesel, diesel-async): `outbox-diesel`.
#[cfg(feature = "postgres")]
pub use outbox_diesel as postgres;
#[cfg(feature = "mysql")]
pub use outbox_diesel::mysql;
#[cfg(feature = "sqlite")]
pub use outbox_diesel::sqlite;

/// Axum / Tower layer: `outbox-axum`.
#[cfg(feature = "axum")]
pub use outbox_axum as axum;

/// RabbitMQ adapter (lapin): `outbox-lapin`.
#[cfg(feature = "rabbitmq")]
pub use outbox_lapin as rabbitmq;
