//! All of the adapter's SQL text (but the migrations: their DDL in
//! [`schema`](crate::schema), their locks and version rows in `migrate.rs`),
//! rendered once per schema into plain structs of `String`s.
//!
//! - [`Sql`]: what depends on the schema only, one struct per part:
//!   recording ([`RecordSql`]), the inbox ([`InboxSql`]), the consumers'
//!   dead letters ([`DeadLetterSql`]), the audit trail ([`AuditSql`]), the
//!   admin's reads and purges ([`AdminSql`]), the relay registry
//!   ([`RelaysSql`]) and the `LISTEN` connection ([`ListenSql`]).
//!   [`PgSettings`](crate::PgSettings) renders it once and shares it (an
//!   [`Arc`]) with every part it hands out; the legacy entry points
//!   ([`Outbox::new`](crate::Outbox::new), [`PgInbox::new`](crate::PgInbox::new),
//!   [`PgOutboxStoreBuilder::schema`](crate::PgOutboxStoreBuilder::schema))
//!   render their own, once, and the `public` schema's is rendered once per
//!   process ([`Sql::public`]), so [`record`](crate::record()) renders nothing.
//! - [`StoreSql`]: the relay store's statements (claims, marks, stats,
//!   replays), which also depend on
//!   [`keep_sent`](crate::PgOutboxStoreBuilder::keep_sent): rendered once,
//!   when the store is built, and shared with its claims.
//! - Fixed text: how a claim's and an admin chunk's transactions begin
//!   ([`CLAIM_BEGIN`], [`ADMIN_BEGIN`]) and the checked commit's probe
//!   ([`PROBE_AND_COMMIT`]).
//!
//! `explain_claim`'s statements ([`ExplainSql`]) are the only ones rendered
//! per call: they carry the explained claim's limits as literals (a
//! diagnostic, run by hand).
//!
//! Each field documents the statement's binds (`$1`, …) and what it
//! returns; the code that runs it binds exactly those. Only the admin's
//! filters ([`EventFilter`](outbox_core::admin::EventFilter)) are SQL built
//! per call (their `WHERE` conditions and binds vary); the fixed heads and
//! tails around them are fields of [`AdminSql`], written so that their own
//! binds come first (`$1`, `$2`, …) and the filter's follow.
//!
//! # Other dialects
//! Every struct here is the contract between the code that runs a
//! statement and the text that a dialect renders: today only PostgreSQL's
//! (the `postgres` constructors). MySQL and SQLite (issue 17) are meant to
//! add their own constructors that fill the same fields with their own text
//! for the same binds and result columns (e.g. `SKIP LOCKED` claims,
//! `ON DUPLICATE KEY`/`ON CONFLICT` inbox inserts), leaving the callers as
//! they are. Nothing here but the rendering knows the dialect.

mod admin;
mod audit;
mod dead_letters;
mod inbox;
mod listen;
mod record;
mod relays;
mod store;
mod transaction;

use std::sync::{Arc, OnceLock};

use outbox_core::EventStatus;

use crate::schema::Schema;

pub(crate) use admin::{ADMIN_BEGIN, ADMIN_LOCK_TIMEOUT, AdminSql, ChunkSql, ERROR_KEY};
pub(crate) use audit::AuditSql;
pub(crate) use dead_letters::DeadLetterSql;
pub(crate) use inbox::InboxSql;
pub(crate) use listen::ListenSql;
pub(crate) use record::RecordSql;
pub(crate) use relays::RelaysSql;
pub(crate) use store::{CLAIM_BEGIN, COLUMNS, ExplainSql, StoreSql};
pub(crate) use transaction::{PROBE, PROBE_AND_COMMIT};

/// The SQL of every part of one schema's outbox but the relay store's
/// claims and marks ([`StoreSql`]), rendered once.
#[derive(Debug)]
pub(crate) struct Sql {
    /// The schema it was rendered for.
    pub(crate) schema: Schema,
    pub(crate) record: RecordSql,
    pub(crate) inbox: InboxSql,
    pub(crate) dead_letters: DeadLetterSql,
    pub(crate) audit: AuditSql,
    pub(crate) admin: AdminSql,
    pub(crate) relays: RelaysSql,
    pub(crate) listen: ListenSql,
}

impl Sql {
    /// PostgreSQL's text for `schema`.
    pub(crate) fn postgres(schema: &Schema) -> Self {
        Sql {
            schema: schema.clone(),
            record: RecordSql::postgres(schema),
            inbox: InboxSql::postgres(schema),
            dead_letters: DeadLetterSql::postgres(schema),
            audit: AuditSql::postgres(schema),
            admin: AdminSql::postgres(schema),
            relays: RelaysSql::postgres(schema),
            listen: ListenSql::postgres(schema),
        }
    }

    /// `schema`'s SQL: the process-wide one of `public`, rendered once,
    /// or a new rendering for any other schema.
    pub(crate) fn for_schema(schema: &Schema) -> Arc<Self> {
        if *schema == Schema::default() {
            Sql::public()
        } else {
            Arc::new(Sql::postgres(schema))
        }
    }

    /// The `public` schema's SQL, rendered once per process (the default
    /// recorder, inbox and dead letters share it).
    pub(crate) fn public() -> Arc<Self> {
        static PUBLIC: OnceLock<Arc<Sql>> = OnceLock::new();
        Arc::clone(PUBLIC.get_or_init(|| Arc::new(Sql::postgres(&Schema::default()))))
    }
}

/// `'pending', 'retry'` for a list of statuses.
pub(crate) fn literals(statuses: &[EventStatus]) -> String {
    statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_is_rendered_once() {
        assert!(Arc::ptr_eq(&Sql::public(), &Sql::public()));
        assert!(Arc::ptr_eq(
            &Sql::for_schema(&Schema::default()),
            &Sql::public()
        ));
    }

    #[test]
    fn every_statement_names_the_schema() -> crate::Result<()> {
        let sql = Sql::postgres(&Schema::new("bill\"ing")?);
        for text in [
            &sql.record.insert_one,
            &sql.inbox.insert,
            &sql.inbox.insert_all,
            &sql.dead_letters.insert,
            &sql.audit.begin,
            &sql.admin.show,
            &sql.relays.register,
        ] {
            assert!(text.contains("\"bill\"\"ing\"."), "{text}");
        }
        Ok(())
    }
}
