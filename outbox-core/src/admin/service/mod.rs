//! [`Admin`]: chunked, audited, permission-checked admin verbs over any
//! [`OutboxAdmin`].
//!
//! This file holds the type, its settings and the reads; the parts:
//! - `mutations.rs`: replay, skip, retry now, purge, pause and resume, and
//!   what they report;
//! - `chunked.rs`: the run they share: the selection checked, the caller
//!   authorized, the audit row written, the chunks run, the end recorded;
//! - `error.rs`: [`AdminError`].

mod chunked;
mod error;
mod mutations;

use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

pub use error::AdminError;
pub use mutations::{ActionReport, PurgeTarget};

use super::{
    AuditRecord, EventDetail, EventFilter, EventSummary, FailureGroup, OutboxAdmin, Page,
    RelayInfo, StatusReport,
};

/// The admin verbs over a store: see the [module docs](super).
#[derive(Debug, Clone)]
pub struct Admin<S> {
    store: S,
    chunk_size: usize,
    chunk_pause: Duration,
    dedup_window: Duration,
}

impl<S: OutboxAdmin> Admin<S> {
    /// Admin verbs over `store`: chunks of 500, no pause between chunks,
    /// a dedup window of 14 days.
    pub fn new(store: S) -> Self {
        Admin {
            store,
            chunk_size: 500,
            chunk_pause: Duration::ZERO,
            dedup_window: Duration::from_secs(14 * 24 * 3600),
        }
    }

    /// Rows changed per transaction (default 500, at least 1).
    #[must_use]
    pub fn chunk_size(mut self, n: usize) -> Self {
        self.chunk_size = n.max(1);
        self
    }

    /// Pause between chunks (default none).
    #[must_use]
    pub fn chunk_pause(mut self, pause: Duration) -> Self {
        self.chunk_pause = pause;
        self
    }

    /// How long consumers keep inbox entries (default 14 days, the
    /// janitor's default inbox retention): a replay of events older than
    /// this warns that consumers may process them again.
    #[must_use]
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The outbox at a glance.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn status(&self) -> Result<StatusReport, AdminError> {
        self.store.status().await.map_err(AdminError::store)
    }

    /// A page of events matching `filter` after the cursor `after`.
    ///
    /// # Errors
    /// [`AdminError::Invalid`] for a `limit` of 0 or over 10,000;
    /// [`AdminError::Store`].
    pub async fn list(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Page<EventSummary>, AdminError> {
        check_limit(limit)?;
        Self::check_text(filter)?;
        self.store
            .list(filter, after, limit)
            .await
            .map_err(AdminError::store)
    }

    /// One event, whole.
    ///
    /// # Errors
    /// [`AdminError::NotFound`]; [`AdminError::Store`].
    pub async fn show(&self, id: Uuid) -> Result<EventDetail, AdminError> {
        self.store
            .show(id)
            .await
            .map_err(AdminError::store)?
            .ok_or_else(|| AdminError::NotFound(format!("no outbox event has the id {id}")))
    }

    /// Dead and retrying events grouped by event type and normalized error.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn failure_groups(
        &self,
        filter: &EventFilter,
    ) -> Result<Vec<FailureGroup>, AdminError> {
        Self::check_text(filter)?;
        self.store
            .failure_groups(filter)
            .await
            .map_err(AdminError::store)
    }

    /// Registered relays.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, AdminError> {
        self.store.relays().await.map_err(AdminError::store)
    }

    /// The audit trail, newest first, rows with `id < before`.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn audit_log(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, AdminError> {
        self.store
            .audit_log(before, limit.clamp(1, 10_000))
            .await
            .map_err(AdminError::store)
    }
}

/// A page size between 1 and 10,000.
pub(crate) fn check_limit(limit: usize) -> Result<(), AdminError> {
    if (1..=10_000).contains(&limit) {
        Ok(())
    } else {
        Err(AdminError::Invalid(format!(
            "limit must be between 1 and 10000, not {limit}"
        )))
    }
}

/// The time `age` ago, `None` when that is out of the calendar's range.
pub(crate) fn ago(age: Duration) -> Option<chrono::DateTime<Utc>> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
}

/// `14 days`, `3 h`, `90 s`.
fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 86_400 && secs.is_multiple_of(86_400) {
        format!("{} days", secs / 86_400)
    } else if secs >= 3_600 && secs.is_multiple_of(3_600) {
        format!("{} h", secs / 3_600)
    } else {
        format!("{secs} s")
    }
}
