//! PostgreSQL adapter of the `outbox` transactional outbox (diesel and
//! diesel-async). **Not implemented yet**: this crate reserves the name and
//! its place in the workspace.
//!
//! Planned (see the project README's roadmap): embedded migrations for
//! `outbox_events` and `inbox_events`, `record(conn, &event)` inside the
//! caller's transaction for async and sync connections, the relay's
//! `OutboxStore` with `FOR UPDATE SKIP LOCKED` claims and per-aggregate order,
//! `LISTEN`/`NOTIFY` wakeups, and the `InboxStore`.
//!
//! ```
//! // The vocabulary it will implement lives in outbox-core:
//! use outbox_core::{InboxStore, OutboxStore};
//! ```
