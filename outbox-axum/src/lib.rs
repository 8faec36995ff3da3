//! Axum / Tower layer of the `outbox` transactional outbox. **Not implemented
//! yet**: this crate reserves the name and its place in the workspace.
//!
//! Planned (see the project README's roadmap): `OutboxLayer`, a request-scoped
//! transaction (`Tx`) and event collector (`Events`), staged events written
//! to the outbox just before the request's transaction commits, and a relay
//! notified after commit.
//!
//! ```
//! // The relay handle it will notify after each commit:
//! let handle = outbox_core::RelayHandle::new();
//! handle.notify();
//! ```
