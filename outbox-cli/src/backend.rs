//! The back end `DATABASE_URL` names, and the admin store and dead-letter
//! records on it as one type each ([`AnyStore`], [`AnyDeadLetters`]), so
//! every verb is written once: `postgres://…` (PostgreSQL, in
//! `--schema`), `mysql://…` (MariaDB, in the URL's database), `sqlite://path`
//! (SQLite, the file).

use chrono::{DateTime, Utc};
use outbox_core::admin::{
    AuditEntry, AuditRecord, Chunk, DeadLetterGroup, DeadLetterQuery, DeadLetterRecord,
    DeadLetterStore, EventDetail, EventFilter, EventSummary, FailureGroup, OutboxAdmin, Page,
    RelayInfo, ReplayedMessage, StatusReport,
};
use outbox_diesel::mysql::{MysqlDeadLetters, MysqlOutboxStore};
use outbox_diesel::sqlite::{SqliteDeadLetters, SqliteOutboxStore};
use outbox_diesel::{PgDeadLetters, PgOutboxStore};
use uuid::Uuid;

/// A database back end the CLI works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://`: MariaDB 10.6+.
    Mysql,
    /// `sqlite://path`.
    Sqlite,
}

impl Backend {
    /// The back end of `url`, by its scheme; `None` for another scheme.
    pub(crate) fn of(url: &str) -> Option<Backend> {
        let scheme = url.split_once("://")?.0;
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Some(Backend::Postgres),
            "mysql" => Some(Backend::Mysql),
            "sqlite" => Some(Backend::Sqlite),
            _ => None,
        }
    }

    /// Its name in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::Mysql => "MariaDB",
            Backend::Sqlite => "SQLite",
        }
    }
}

/// The outbox store of whichever back end the URL names.
#[derive(Debug, Clone)]
pub(crate) enum AnyStore {
    /// PostgreSQL.
    Postgres(PgOutboxStore),
    /// MariaDB.
    Mysql(MysqlOutboxStore),
    /// SQLite.
    Sqlite(SqliteOutboxStore),
}

/// The consumers' dead-letter records of whichever back end the URL names.
#[derive(Debug, Clone)]
pub(crate) enum AnyDeadLetters {
    /// PostgreSQL.
    Postgres(PgDeadLetters),
    /// MariaDB.
    Mysql(MysqlDeadLetters),
    /// SQLite.
    Sqlite(SqliteDeadLetters),
}

/// `$trait::$method(inner, $args)` on whichever variant `$self` is.
macro_rules! each {
    ($enum:ident as $trait:ident, $self:expr, $method:ident ( $($arg:expr),* )) => {
        match $self {
            $enum::Postgres(inner) => $trait::$method(inner, $($arg),*).await,
            $enum::Mysql(inner) => $trait::$method(inner, $($arg),*).await,
            $enum::Sqlite(inner) => $trait::$method(inner, $($arg),*).await,
        }
    };
}

type Result<T> = std::result::Result<T, outbox_diesel::Error>;

impl OutboxAdmin for AnyStore {
    type Error = outbox_diesel::Error;

    async fn status(&self) -> Result<StatusReport> {
        each!(AnyStore as OutboxAdmin, self, status())
    }

    async fn list(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Page<EventSummary>> {
        each!(AnyStore as OutboxAdmin, self, list(filter, after, limit))
    }

    async fn show(&self, id: Uuid) -> Result<Option<EventDetail>> {
        each!(AnyStore as OutboxAdmin, self, show(id))
    }

    async fn failure_groups(&self, filter: &EventFilter) -> Result<Vec<FailureGroup>> {
        each!(AnyStore as OutboxAdmin, self, failure_groups(filter))
    }

    async fn count(&self, filter: &EventFilter) -> Result<u64> {
        each!(AnyStore as OutboxAdmin, self, count(filter))
    }

    async fn last_seq(&self) -> Result<Option<i64>> {
        each!(AnyStore as OutboxAdmin, self, last_seq())
    }

    async fn head(&self, aggregate_type: &str, aggregate_id: &str) -> Result<Option<EventSummary>> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            head(aggregate_type, aggregate_id)
        )
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64> {
        each!(AnyStore as OutboxAdmin, self, begin_audit(entry))
    }

    async fn finish_audit(&self, audit: i64, outcome: &str) -> Result<()> {
        each!(AnyStore as OutboxAdmin, self, finish_audit(audit, outcome))
    }

    async fn audit_log(&self, before: Option<i64>, limit: usize) -> Result<Vec<AuditRecord>> {
        each!(AnyStore as OutboxAdmin, self, audit_log(before, limit))
    }

    async fn replay_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            replay_chunk(filter, after, limit, audit)
        )
    }

    async fn skip_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            skip_chunk(filter, after, limit, audit)
        )
    }

    async fn retry_now_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            retry_now_chunk(filter, after, limit, audit)
        )
    }

    async fn purge_sent_chunk(
        &self,
        before: DateTime<Utc>,
        after: Option<i64>,
        limit: usize,
        audit: Option<i64>,
    ) -> Result<Chunk> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            purge_sent_chunk(before, after, limit, audit)
        )
    }

    async fn purge_inbox_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
        audit: Option<i64>,
    ) -> Result<u64> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            purge_inbox_chunk(before, limit, audit)
        )
    }

    async fn purge_dead_letter_records_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            purge_dead_letter_records_chunk(before, limit)
        )
    }

    async fn purge_stale_relays(&self, before: DateTime<Utc>) -> Result<u64> {
        each!(AnyStore as OutboxAdmin, self, purge_stale_relays(before))
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>> {
        each!(AnyStore as OutboxAdmin, self, relays())
    }

    async fn set_paused(&self, relay: &str, paused: bool, audit: i64) -> Result<bool> {
        each!(
            AnyStore as OutboxAdmin,
            self,
            set_paused(relay, paused, audit)
        )
    }
}

impl DeadLetterStore for AnyDeadLetters {
    type Error = outbox_diesel::Error;

    async fn list(&self, query: &DeadLetterQuery) -> Result<Page<DeadLetterRecord>> {
        each!(AnyDeadLetters as DeadLetterStore, self, list(query))
    }

    async fn show(&self, id: i64) -> Result<Option<DeadLetterRecord>> {
        each!(AnyDeadLetters as DeadLetterStore, self, show(id))
    }

    async fn groups(&self, queue: Option<&str>) -> Result<Vec<DeadLetterGroup>> {
        each!(AnyDeadLetters as DeadLetterStore, self, groups(queue))
    }

    async fn mark_replayed(&self, messages: &[ReplayedMessage]) -> Result<u64> {
        each!(
            AnyDeadLetters as DeadLetterStore,
            self,
            mark_replayed(messages)
        )
    }

    async fn watermark(&self) -> Result<i64> {
        each!(AnyDeadLetters as DeadLetterStore, self, watermark())
    }

    async fn mark_purged(&self, queues: &[String], watermark: i64) -> Result<u64> {
        each!(
            AnyDeadLetters as DeadLetterStore,
            self,
            mark_purged(queues, watermark)
        )
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64> {
        each!(AnyDeadLetters as DeadLetterStore, self, begin_audit(entry))
    }

    async fn record_audit(&self, audit: i64, count: u64, outcome: Option<&str>) -> Result<()> {
        each!(
            AnyDeadLetters as DeadLetterStore,
            self,
            record_audit(audit, count, outcome)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_names_the_back_end() {
        assert_eq!(Backend::of("postgres://u@db/x"), Some(Backend::Postgres));
        assert_eq!(Backend::of("postgresql://db"), Some(Backend::Postgres));
        assert_eq!(Backend::of("mysql://u:p@db:3306/x"), Some(Backend::Mysql));
        assert_eq!(Backend::of("sqlite://shop.db"), Some(Backend::Sqlite));
        assert_eq!(Backend::of("SQLite:///var/shop.db"), Some(Backend::Sqlite));
        assert_eq!(Backend::of("redis://db"), None);
        assert_eq!(Backend::of("shop.db"), None);
    }
}
