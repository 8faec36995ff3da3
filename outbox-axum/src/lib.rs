//! Axum / Tower layer of the `outbox` transactional outbox: each request gets
//! a database transaction ([`Tx`]) and an event collector ([`Events`]); when
//! the handler answers with a success, the layer writes the staged events
//! into the outbox **in that same transaction** and commits, so the business
//! change and its events are stored together or not at all.
//!
//! ```no_run
//! use axum::http::StatusCode;
//! use axum::response::{IntoResponse, Response};
//! use axum::routing::post;
//! use axum::{Json, Router};
//! use diesel::sql_types::{BigInt, Text};
//! use diesel_async::{AsyncPgConnection, RunQueryDsl};
//! use outbox_axum::{Events, OutboxLayer, Tx};
//! use outbox_core::{DomainEvent, RelayHandle};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize)]
//! struct PlaceOrder {
//!     customer: String,
//!     total_cents: i64,
//! }
//!
//! #[derive(Serialize, diesel::QueryableByName)]
//! struct Order {
//!     #[diesel(sql_type = BigInt)]
//!     id: i64,
//!     #[diesel(sql_type = Text)]
//!     customer: String,
//!     #[diesel(sql_type = BigInt)]
//!     total_cents: i64,
//! }
//!
//! // With the `outbox` facade: `#[derive(DomainEvent)]`.
//! #[derive(Serialize)]
//! struct OrderPlaced {
//!     order_id: i64,
//!     total_cents: i64,
//! }
//!
//! impl DomainEvent for OrderPlaced {
//!     fn aggregate_type(&self) -> &'static str { "order" }
//!     fn event_type(&self) -> &'static str { "order.placed" }
//!     fn aggregate_id(&self) -> String { self.order_id.to_string() }
//! }
//!
//! impl From<&Order> for OrderPlaced {
//!     fn from(order: &Order) -> Self {
//!         OrderPlaced { order_id: order.id, total_cents: order.total_cents }
//!     }
//! }
//!
//! async fn place_order(mut tx: Tx, events: Events, Json(cmd): Json<PlaceOrder>)
//!     -> Result<(StatusCode, Json<Order>), AppError>
//! {
//!     let order = insert_order(&mut tx, &cmd).await?;   // diesel-async on the request's transaction
//!     events.raise(OrderPlaced::from(&order))?;        // staged, not yet written
//!     Ok((StatusCode::CREATED, Json(order)))
//! }
//!
//! async fn insert_order(conn: &mut AsyncPgConnection, cmd: &PlaceOrder)
//!     -> Result<Order, diesel::result::Error>
//! {
//!     diesel::sql_query(
//!         "INSERT INTO orders (customer, total_cents) VALUES ($1, $2) \
//!          RETURNING id, customer, total_cents",
//!     )
//!     .bind::<Text, _>(&cmd.customer)
//!     .bind::<BigInt, _>(cmd.total_cents)
//!     .get_result(conn)
//!     .await
//! }
//!
//! /// Any error answers 500: the layer then rolls the transaction back.
//! struct AppError(Box<dyn std::error::Error + Send + Sync>);
//!
//! impl<E: std::error::Error + Send + Sync + 'static> From<E> for AppError {
//!     fn from(error: E) -> Self {
//!         AppError(Box::new(error))
//!     }
//! }
//!
//! impl IntoResponse for AppError {
//!     fn into_response(self) -> Response {
//!         tracing::error!(error = %self.0, "request failed");
//!         StatusCode::INTERNAL_SERVER_ERROR.into_response()
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let url = "postgres://postgres@127.0.0.1:5432/app";
//!     outbox_diesel::migrate_url(url, "public").await?;
//!     let pool = outbox_diesel::pool(url, 16)?;
//!     // Shared with the relay (`Relay::builder(..).handle(relay.clone())`),
//!     // which is then woken after each commit instead of at its next poll.
//!     let relay = RelayHandle::new();
//!
//!     let app = Router::new()
//!         .route("/orders", post(place_order))
//!         .layer(OutboxLayer::new(pool.clone()).relay(relay.clone()));
//!
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! ```
//!
//! # What the layer does, per request
//! 1. Reads the correlation id (`x-request-id`, else `x-correlation-id`, else
//!    a new UUID v7; see [`OutboxLayer::correlation_header`]) and the W3C
//!    `traceparent`/`tracestate` headers (and `baggage`, kept where
//!    [`carry_baggage`](outbox_core::trace_context::carry_baggage) is on);
//!    every event of the request gets them (through [`outbox_core::context`], so `outbox_diesel::record`
//!    called in the handler gets them too).
//! 2. Installs the event collector: the [`Events`] extractor, and a tokio
//!    task-local behind [`raise`] and [`Events::current`], so domain code
//!    deep in the call stack raises events without plumbing. `tokio::spawn`
//!    does not inherit a task-local: carry it with [`Events::scope`].
//! 3. Runs the handler. The first [`Tx`] extraction takes a pooled
//!    connection and runs `BEGIN`; handlers that do not ask for one never
//!    touch the pool.
//! 4. On a success response (2xx by default, see [`OutboxLayer::commit_if`]):
//!    writes the staged events with one `INSERT` in the request's
//!    transaction, commits, then wakes the relay ([`OutboxLayer::relay`]).
//!    If writing or committing fails, the client gets a `500` instead, never
//!    a 2xx for a change that was rolled back: also when the handler left
//!    the transaction aborted (it caught a failed statement's error) or a
//!    nested transaction open (a cancelled `tx.transaction(..)`), where a
//!    plain `COMMIT` would have rolled back or only released a savepoint.
//! 5. On any other response, an inner service error, a panic or a dropped
//!    request future: rolls back and drops the staged events.
//!
//! Events staged in a request that never extracted [`Tx`] must be written
//! with [`Events::flush`] inside the handler's own transaction; otherwise
//! the request fails with a `500` and an error log (or, with
//! [`OutboxLayer::standalone`], they are written in a short transaction of
//! their own). They are never silently dropped.
//!
//! # The connection pool
//! [`OutboxLayer::new`] takes any [`ConnectionSource`]; diesel-async's
//! deadpool `Pool<AsyncPgConnection>` (what `outbox_diesel::pool` builds,
//! and what the relay's `PgOutboxStore` uses) implements it. Deadpool is the
//! default because its connections are owned values that can be held across
//! `await`s and detached from the pool: a transaction interrupted mid-way is
//! closed, never returned to the pool inside `BEGIN`. bb8 or a connection
//! per request plug in through the same trait.
//!
//! Taking a connection plus its `BEGIN` is bounded by
//! [`OutboxLayer::acquire_timeout`] (5 s), so a request never hangs on an
//! exhausted pool or an unreachable database: [`Tx`] is rejected with
//! `503 Service Unavailable`, a JSON body and `Retry-After`
//! ([`OutboxLayer::retry_after`], 1 s). This bound is the layer's own and
//! holds whatever the pool's settings. [`outbox_diesel::pool`] bounds its
//! waits too, at [`POOL_WAIT_TIMEOUT`](outbox_diesel::POOL_WAIT_TIMEOUT)
//! (30 s) for a free connection and
//! [`POOL_CONNECT_TIMEOUT`](outbox_diesel::POOL_CONNECT_TIMEOUT) (10 s) for a
//! new one, both longer than the layer's default: a request gets the
//! layer's `503` first. Whichever bound is shorter ends the wait; a pool's
//! own timeout error is answered `503` as well.
//!
//! # Error responses
//! Every response the layer makes itself is JSON, `{"error": "..."}`, with
//! the details in the logs (`tracing`), not in the body:
//!
//! | status | when |
//! |---|---|
//! | `503` + `Retry-After` | [`Tx`] could not get a connection or `BEGIN` in time ([`TxRejection::Unavailable`]) |
//! | `500` | writing the events or `COMMIT` failed; the transaction was aborted by a failed statement, or a nested transaction was left open, so no real `COMMIT` could happen; events staged but never written; a [`Tx`] kept alive after the handler; [`Tx`] extracted twice; an extractor used without the layer |
//!
//! # The admin API
//! [`admin::AdminRouter`] serves the verbs of `outbox_core::admin` (status,
//! events, failure groups, replay, skip, retry-now, purge, relays, audit)
//! as JSON endpoints, behind bearer tokens or your own authentication, to
//! mount under any prefix: see the [`admin`] module.
//!
#![doc = include_str!("../docs/layer-order.md")]
#![doc = include_str!("../docs/transaction-scope.md")]
#![doc = include_str!("../docs/failures.md")]
//!
//! # Feature flags
//! This crate has none; the `outbox` facade enables it with its `axum`
//! feature.
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

pub mod admin;
mod correlation;
mod error;
mod events;
mod future;
mod layer;
mod request;
mod service;
mod source;
mod tx;

pub use error::{Error, MissingLayer, Result, TxRejection};
pub use events::{Events, raise};
pub use future::ResponseFuture;
pub use layer::OutboxLayer;
pub use service::OutboxService;
pub use source::{BoxError, ConnectionSource};
pub use tx::Tx;
