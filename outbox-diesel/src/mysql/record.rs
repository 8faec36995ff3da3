//! [`MysqlOutbox`]: recording events inside the caller's MariaDB
//! transaction.

use std::sync::Arc;

use diesel::mysql::Mysql;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Datetime, Integer, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::{DomainEvent, EventEnvelope, Headers};
use uuid::Uuid;

use super::sql::{IN_TRANSACTION_PROBE, MysqlSql, RECORD_CHUNK};
use crate::connection::in_transaction;
use crate::prepared::Prepared;
use crate::{Error, Result};

/// Records events in the caller's MariaDB transaction, in the outbox of
/// one database: the counterpart of [`Outbox`](crate#structs) on
/// PostgreSQL. Get one from [`MysqlSettings::outbox`](super::MysqlSettings::outbox)
/// (or `default()`: the connection's database).
#[derive(Clone)]
pub struct MysqlOutbox {
    sql: Arc<MysqlSql>,
    prepare: bool,
}

impl std::fmt::Debug for MysqlOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlOutbox")
            .field("database", &self.sql.database)
            .field("prepare", &self.prepare)
            .finish()
    }
}

impl Default for MysqlOutbox {
    fn default() -> Self {
        MysqlOutbox::from_sql(MysqlSql::default_database(), true)
    }
}

impl MysqlOutbox {
    pub(crate) fn from_sql(sql: Arc<MysqlSql>, prepare: bool) -> Self {
        MysqlOutbox { sql, prepare }
    }

    /// The database named by the settings; `None`: the connection's.
    #[must_use]
    pub fn database(&self) -> Option<&str> {
        self.sql.database.as_deref()
    }

    /// Records `event` in the transaction open on `conn` and returns its id.
    ///
    /// # Errors
    /// [`Error::NoTransaction`] if no transaction is open on `conn`;
    /// [`Error::NotCommitted`] if the server rolled the transaction back
    /// (a deadlock) although diesel still counts it open: nothing is
    /// inserted; [`Error::Event`] if the event is invalid or its payload
    /// does not serialize; [`Error::Database`] if the `INSERT` fails.
    pub async fn record<E: DomainEvent + Sync>(
        &self,
        conn: &mut AsyncMysqlConnection,
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
        conn: &mut AsyncMysqlConnection,
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
        conn: &mut AsyncMysqlConnection,
        envelopes: &[EventEnvelope],
    ) -> Result<()> {
        in_transaction(conn)?;
        if envelopes.is_empty() {
            return Ok(());
        }
        // All of them before any is inserted: nothing is recorded if one is
        // invalid.
        for envelope in envelopes {
            envelope.validate()?;
            check_json(envelope)?;
        }
        if envelopes.len() > 1 {
            let probe: Open = diesel::sql_query(IN_TRANSACTION_PROBE)
                .get_result(conn)
                .await?;
            if probe.open != 1 {
                return Err(rolled_back());
            }
        }
        for chunk in envelopes.chunks(RECORD_CHUNK) {
            let inserted = self.insert_query(chunk).execute(&mut *conn).await?;
            if inserted != chunk.len() {
                return Err(rolled_back());
            }
        }
        Ok(())
    }

    /// The `INSERT` of `envelopes` (validated), at most [`RECORD_CHUNK`].
    fn insert_query(
        &self,
        envelopes: &[EventEnvelope],
    ) -> Prepared<BoxedSqlQuery<'static, Mysql, SqlQuery>> {
        let (text, keep) = match envelopes {
            [_] => (self.sql.record_one.clone(), self.prepare),
            _ => (self.sql.record_many(envelopes.len()), false),
        };
        let mut query = diesel::sql_query(text).into_boxed::<Mysql>();
        for envelope in envelopes {
            query = query
                .bind::<Text, _>(envelope.id.to_string())
                .bind::<Text, _>(envelope.aggregate_type.clone())
                .bind::<Text, _>(envelope.aggregate_id.clone())
                .bind::<Nullable<BigInt>, _>(envelope.aggregate_version)
                .bind::<Text, _>(envelope.event_type.clone())
                .bind::<Integer, _>(envelope.schema_version)
                .bind::<Text, _>(envelope.payload.clone())
                .bind::<Text, _>(headers_json(&envelope.headers))
                .bind::<Datetime, _>(envelope.occurred_at.naive_utc());
        }
        Prepared::new(query, keep)
    }
}

#[derive(diesel::QueryableByName)]
struct Open {
    #[diesel(sql_type = BigInt)]
    open: i64,
}

/// The server has no transaction open although diesel counts one: an
/// InnoDB deadlock (or a lock wait timeout with
/// `innodb_rollback_on_timeout`) rolled it back.
pub(crate) fn rolled_back() -> Error {
    Error::NotCommitted {
        reason: "nothing was recorded: MariaDB rolled the transaction back (a deadlock, or \
                 a lock wait timeout with innodb_rollback_on_timeout) and the code went on \
                 as if it had not; fail when a statement fails, and retry the whole \
                 transaction after a deadlock. (Or the session runs with autocommit off, \
                 which this library refuses: after a deadlock such a session starts a new \
                 transaction silently)"
            .into(),
        source: None,
    }
}

/// PostgreSQL's `json` column refuses a payload that is not JSON; the
/// MariaDB column is text (its `JSON_VALID` refuses JSON that PostgreSQL
/// stores, nesting of 32 levels and more, and accepts some that is not), so
/// the recorder checks it here, with serde_json: whatever it parses is
/// stored. Its limits: nesting deeper than 128 levels and lone surrogate
/// escapes (`"\ud800"`) are refused, which PostgreSQL would store; a
/// payload serialized from a Rust value never has the latter.
fn check_json(envelope: &EventEnvelope) -> Result<()> {
    serde_json::from_str::<serde::de::IgnoredAny>(&envelope.payload)
        .map(|_| ())
        .map_err(|e| {
            Error::Event(outbox_core::Error::InvalidEvent {
                event_type: envelope.event_type.clone(),
                reason: format!("the payload is not JSON: {e}"),
            })
        })
}

fn headers_json(headers: &Headers) -> String {
    // A map of strings always serializes.
    serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned())
}
