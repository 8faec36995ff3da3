//! [`SqliteOutbox`]: recording events inside the caller's SQLite
//! transaction.

use std::sync::Arc;

use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::sqlite::Sqlite;
use outbox_core::{DomainEvent, EventEnvelope, Headers};
use uuid::Uuid;

use super::AsyncSqliteConnection;
use super::sql::{SqliteSql, micros};
use crate::connection::{in_transaction, sqlite_execute_if_open};
use crate::prepared::Prepared;
use crate::{Error, Result};

/// Records events in the caller's SQLite transaction: the counterpart of
/// [`Outbox`](crate#structs) on PostgreSQL. Get one from
/// [`SqliteSettings::outbox`](super::SqliteSettings::outbox) (or
/// `default()`).
#[derive(Clone)]
pub struct SqliteOutbox {
    sql: Arc<SqliteSql>,
    prepare: bool,
}

impl std::fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("prepare", &self.prepare)
            .finish()
    }
}

impl Default for SqliteOutbox {
    fn default() -> Self {
        SqliteOutbox::from_sql(SqliteSql::shared(), true)
    }
}

impl SqliteOutbox {
    pub(crate) fn from_sql(sql: Arc<SqliteSql>, prepare: bool) -> Self {
        SqliteOutbox { sql, prepare }
    }

    /// Records `event` in the transaction open on `conn` and returns its id.
    ///
    /// # Errors
    /// [`Error::NoTransaction`] if no transaction is open on `conn`;
    /// [`Error::NotCommitted`] if SQLite rolled the transaction back (see
    /// [`Connection`](crate::Connection)) although diesel still counts it
    /// open: nothing is inserted; [`Error::Event`] if the event is invalid
    /// or its payload is not JSON (SQLite's `json_valid`, which also
    /// refuses nesting deeper than 1,000 levels); [`Error::Database`] if the
    /// `INSERT` fails.
    pub async fn record<E: DomainEvent + Sync>(
        &self,
        conn: &mut AsyncSqliteConnection,
        event: &E,
    ) -> Result<Uuid> {
        let envelope = EventEnvelope::from_event(event)?;
        let id = envelope.id;
        self.record_envelopes(conn, &[envelope]).await?;
        Ok(id)
    }

    /// Records `events` with one `INSERT`, in order, and returns their ids.
    ///
    /// # Errors
    /// As [`record`](Self::record); nothing is recorded if one is invalid.
    pub async fn record_all<E: DomainEvent + Sync>(
        &self,
        conn: &mut AsyncSqliteConnection,
        events: &[E],
    ) -> Result<Vec<Uuid>> {
        let envelopes = events
            .iter()
            .map(|event| EventEnvelope::from_event(event).map_err(Error::from))
            .collect::<Result<Vec<_>>>()?;
        self.record_envelopes(conn, &envelopes).await?;
        Ok(envelopes.iter().map(|e| e.id).collect())
    }

    /// Records envelopes built elsewhere (the Axum layer's staged events).
    ///
    /// # Errors
    /// As [`record`](Self::record).
    pub async fn record_envelopes(
        &self,
        conn: &mut AsyncSqliteConnection,
        envelopes: &[EventEnvelope],
    ) -> Result<()> {
        in_transaction(conn)?;
        if envelopes.is_empty() {
            return Ok(());
        }
        let query = self.insert_query(envelopes)?;
        let inserted = sqlite_execute_if_open(conn, query)
            .await
            .map_err(|error| invalid_payload(error, envelopes))?
            .ok_or_else(rolled_back)?;
        if inserted != envelopes.len() {
            return Err(Error::Config(format!(
                "the outbox INSERT stored {inserted} of {} events",
                envelopes.len()
            )));
        }
        Ok(())
    }

    fn insert_query(
        &self,
        envelopes: &[EventEnvelope],
    ) -> Result<Prepared<BoxedSqlQuery<'static, Sqlite, SqlQuery>>> {
        for envelope in envelopes {
            envelope.validate()?;
        }
        if let [envelope] = envelopes {
            let query = diesel::sql_query(self.sql.record_one.clone())
                .into_boxed::<Sqlite>()
                .bind::<Text, _>(envelope.id.to_string())
                .bind::<Text, _>(envelope.aggregate_type.clone())
                .bind::<Text, _>(envelope.aggregate_id.clone())
                .bind::<Nullable<BigInt>, _>(envelope.aggregate_version)
                .bind::<Text, _>(envelope.event_type.clone())
                .bind::<Integer, _>(envelope.schema_version)
                .bind::<Text, _>(envelope.payload.clone())
                .bind::<Text, _>(headers_json(&envelope.headers))
                .bind::<BigInt, _>(micros(envelope.occurred_at));
            return Ok(Prepared::new(query, self.prepare));
        }
        let rows: Vec<serde_json::Value> = envelopes
            .iter()
            .map(|envelope| {
                serde_json::json!([
                    envelope.id.to_string(),
                    envelope.aggregate_type,
                    envelope.aggregate_id,
                    envelope.aggregate_version,
                    envelope.event_type,
                    envelope.schema_version,
                    envelope.payload,
                    headers_json(&envelope.headers),
                    micros(envelope.occurred_at),
                ])
            })
            .collect();
        let query = diesel::sql_query(self.sql.record_many.clone())
            .into_boxed::<Sqlite>()
            .bind::<Text, _>(serde_json::Value::Array(rows).to_string());
        Ok(Prepared::new(query, self.prepare))
    }
}

/// SQLite has no transaction open although diesel counts one: an error
/// rolled it back (see [`Connection`](crate::Connection)).
pub(crate) fn rolled_back() -> Error {
    Error::NotCommitted {
        reason: "SQLite rolled the transaction back (an error such as SQLITE_FULL, \
                 SQLITE_IOERR, SQLITE_BUSY or an interrupt, or RAISE(ROLLBACK) in a trigger) \
                 and the code went on as if it had not: nothing was recorded. Fail when a \
                 statement fails"
            .into(),
        source: None,
    }
}

/// The schema's `CHECK (json_valid(payload))` refused a payload: an
/// [`Error::Event`], as the event is at fault. `json_valid` accepts what
/// PostgreSQL's `json` accepts, but nesting deeper than 1,000 levels.
fn invalid_payload(error: diesel::result::Error, envelopes: &[EventEnvelope]) -> Error {
    let refused = matches!(
        &error,
        diesel::result::Error::DatabaseError(_, info)
            if info.message().contains("outbox_events_payload_json")
    );
    if !refused {
        return Error::Database(error);
    }
    // The first payload serde_json cannot parse is the likely culprit; a
    // payload nested too deep for SQLite may parse.
    let culprit = envelopes
        .iter()
        .find(|e| serde_json::from_str::<serde::de::IgnoredAny>(&e.payload).is_err())
        .or(envelopes.first());
    Error::Event(outbox_core::Error::InvalidEvent {
        event_type: culprit.map(|e| e.event_type.clone()).unwrap_or_default(),
        reason: "the payload is not JSON (SQLite's json_valid refused it; it also refuses \
                 nesting deeper than 1,000 levels)"
            .into(),
    })
}

fn headers_json(headers: &Headers) -> String {
    // A map of strings always serializes.
    serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned())
}
