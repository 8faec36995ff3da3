//! Recording events inside the caller's transaction.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};
use outbox_core::{DomainEvent, EventEnvelope, Headers};
use uuid::Uuid;

use crate::prepared::Prepared;
use crate::schema::Schema;
use crate::sql::Sql;
use crate::{Error, Result};

/// Where and how events are recorded: the schema of the outbox table and
/// whether a `NOTIFY` wakes relays.
///
/// [`record`](crate::record) and friends use `Outbox::default()` (schema
/// `public`, notifications on); build your own for another schema.
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
/// use outbox_core::DomainEvent;
/// use outbox_diesel::Outbox;
/// # #[derive(serde::Serialize)] struct Paid { id: u32 }
/// # impl DomainEvent for Paid {
/// #     fn aggregate_type(&self) -> &'static str { "order" }
/// #     fn event_type(&self) -> &'static str { "order.paid" }
/// #     fn aggregate_id(&self) -> String { self.id.to_string() }
/// # }
///
/// # async fn run(conn: &mut AsyncPgConnection) -> Result<(), outbox_diesel::Error> {
/// let outbox = Outbox::new("billing")?;
/// conn.transaction::<_, outbox_diesel::Error, _>(async |conn| {
///     // ... the business change on `conn` ...
///     outbox.record(conn, &Paid { id: 7 }).await?;
///     Ok(())
/// })
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Outbox {
    schema: Schema,
    /// The schema's SQL, shared with the other parts of its settings.
    pub(crate) sql: Arc<Sql>,
    notify: bool,
    prepare: bool,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("schema", &self.schema.name())
            .field("notify", &self.notify)
            .field("prepare", &self.prepare)
            .finish_non_exhaustive()
    }
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox::from_sql(Sql::public(), true, true)
    }
}

impl Outbox {
    /// The outbox in `schema`, with `NOTIFY` wakeups on.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid schema name.
    pub fn new(schema: &str) -> Result<Self> {
        Ok(Outbox::from_sql(
            Sql::for_schema(&Schema::new(schema)?),
            true,
            true,
        ))
    }

    /// The recorder on `sql` (of [`PgSettings::outbox`](crate::PgSettings::outbox)).
    pub(crate) fn from_sql(sql: Arc<Sql>, notify: bool, prepare: bool) -> Self {
        Outbox {
            schema: sql.schema.clone(),
            sql,
            notify,
            prepare,
        }
    }

    /// Turns the `NOTIFY` on recording on or off (default on).
    ///
    /// `NOTIFY` wakes relays within milliseconds, but PostgreSQL serializes
    /// the commits of notifying transactions on a global lock: at very high
    /// write rates, turn it off and rely on in-process wakeups
    /// ([`RelayHandle::notify`](outbox_core::RelayHandle::notify)) and polling.
    #[must_use]
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }

    /// Whether the recording `INSERT` stays prepared on each connection
    /// (default on: one round trip per `record` instead of two). Turn it off
    /// behind PgBouncer in transaction pooling mode older than 1.21 (or
    /// without `max_prepared_statements`), which cannot keep prepared
    /// statements; Diesel's own query builder needs the same.
    #[must_use]
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepare = on;
        self
    }

    /// The schema of this outbox.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// `true` when recording sends a `NOTIFY`.
    pub fn notifies(&self) -> bool {
        self.notify
    }

    /// `true` when the recording `INSERT` stays prepared on each connection.
    pub fn prepares_statements(&self) -> bool {
        self.prepare
    }

    /// The one `INSERT` for `envelopes` (validated first).
    pub(crate) fn insert_query(
        &self,
        envelopes: &[EventEnvelope],
    ) -> Result<Prepared<BoxedSqlQuery<'static, Pg, SqlQuery>>> {
        if let [envelope] = envelopes {
            envelope.validate()?;
            return Ok(Prepared::new(
                diesel::sql_query(self.sql.record.insert(true, self.notify))
                    .into_boxed()
                    .bind::<diesel::sql_types::Uuid, _>(envelope.id)
                    .bind::<Text, _>(envelope.aggregate_type.clone())
                    .bind::<Text, _>(envelope.aggregate_id.clone())
                    .bind::<Nullable<BigInt>, _>(envelope.aggregate_version)
                    .bind::<Text, _>(envelope.event_type.clone())
                    .bind::<Integer, _>(envelope.schema_version)
                    .bind::<Text, _>(envelope.payload.clone())
                    .bind::<Text, _>(headers_json(&envelope.headers))
                    .bind::<Timestamptz, _>(envelope.occurred_at),
                self.prepare,
            ));
        }
        let n = envelopes.len();
        let mut ids = Vec::with_capacity(n);
        let mut aggregate_types = Vec::with_capacity(n);
        let mut aggregate_ids = Vec::with_capacity(n);
        let mut aggregate_versions: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut event_types = Vec::with_capacity(n);
        let mut schema_versions = Vec::with_capacity(n);
        let mut payloads = Vec::with_capacity(n);
        let mut headers = Vec::with_capacity(n);
        let mut occurred: Vec<DateTime<Utc>> = Vec::with_capacity(n);
        for envelope in envelopes {
            envelope.validate()?;
            ids.push(envelope.id);
            aggregate_types.push(envelope.aggregate_type.clone());
            aggregate_ids.push(envelope.aggregate_id.clone());
            aggregate_versions.push(envelope.aggregate_version);
            event_types.push(envelope.event_type.clone());
            schema_versions.push(envelope.schema_version);
            payloads.push(envelope.payload.clone());
            headers.push(headers_json(&envelope.headers));
            occurred.push(envelope.occurred_at);
        }
        Ok(Prepared::new(
            diesel::sql_query(self.sql.record.insert(false, self.notify))
                .into_boxed()
                .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
                .bind::<Array<Text>, _>(aggregate_types)
                .bind::<Array<Text>, _>(aggregate_ids)
                .bind::<Array<Nullable<BigInt>>, _>(aggregate_versions)
                .bind::<Array<Text>, _>(event_types)
                .bind::<Array<Integer>, _>(schema_versions)
                .bind::<Array<Text>, _>(payloads)
                .bind::<Array<Text>, _>(headers)
                .bind::<Array<Timestamptz>, _>(occurred),
            self.prepare,
        ))
    }
}

fn headers_json(headers: &Headers) -> String {
    // A map of strings always serializes.
    serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned())
}

/// Builds the envelopes of `events`.
pub(crate) fn envelopes<E: DomainEvent>(events: &[E]) -> Result<Vec<EventEnvelope>> {
    events
        .iter()
        .map(|event| EventEnvelope::from_event(event).map_err(Error::from))
        .collect()
}

/// The ids of `envelopes`.
pub(crate) fn ids(envelopes: &[EventEnvelope]) -> Vec<Uuid> {
    envelopes.iter().map(|e| e.id).collect()
}

/// Async recording (`diesel_async::AsyncPgConnection`, plain or pooled).
mod async_pg {
    use diesel_async::{AsyncPgConnection, RunQueryDsl};
    use outbox_core::{DomainEvent, EventEnvelope};
    use uuid::Uuid;

    use super::{Outbox, envelopes, ids};
    use crate::Result;
    use crate::connection::in_transaction;

    impl Outbox {
        /// Records `event` in the transaction open on `conn`; returns its id.
        ///
        /// # Errors
        /// [`Error::NoTransaction`](crate::Error::NoTransaction) if no transaction is open (nothing is
        /// written), [`Error::Event`](crate::Error::Event) if the event is invalid or fails to
        /// serialize (nothing is written; the transaction stays usable, roll
        /// it back), [`Error::Database`](crate::Error::Database) if the insert fails.
        pub async fn record<E: DomainEvent + Sync>(
            &self,
            conn: &mut AsyncPgConnection,
            event: &E,
        ) -> Result<Uuid> {
            let envelope = EventEnvelope::from_event(event)?;
            let id = envelope.id;
            self.record_envelopes(conn, &[envelope]).await?;
            Ok(id)
        }

        /// Records `events` with one `INSERT`; returns their ids in order.
        ///
        /// # Errors
        /// As [`record`](Self::record); on any error nothing is written.
        pub async fn record_all<E: DomainEvent + Sync>(
            &self,
            conn: &mut AsyncPgConnection,
            events: &[E],
        ) -> Result<Vec<Uuid>> {
            let envelopes = envelopes(events)?;
            self.record_envelopes(conn, &envelopes).await?;
            Ok(ids(&envelopes))
        }

        /// Records prepared envelopes (e.g. with headers attached) with one
        /// `INSERT`.
        ///
        /// # Errors
        /// As [`record`](Self::record).
        pub async fn record_envelopes(
            &self,
            conn: &mut AsyncPgConnection,
            envelopes: &[EventEnvelope],
        ) -> Result<()> {
            in_transaction(conn)?;
            if envelopes.is_empty() {
                return Ok(());
            }
            self.insert_query(envelopes)?.execute(conn).await?;
            Ok(())
        }
    }
}

/// Sync recording (`diesel::PgConnection`), feature `sync`.
#[cfg(feature = "sync")]
mod sync_pg {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    use diesel::{PgConnection, RunQueryDsl};
    use outbox_core::{DomainEvent, EventEnvelope};
    use uuid::Uuid;

    use super::{Outbox, envelopes, ids};
    use crate::{Error, Result};

    impl Outbox {
        /// Records `event` in the transaction open on a sync `conn`.
        ///
        /// # Errors
        /// As [`record`](Self::record).
        pub fn record_sync<E: DomainEvent>(
            &self,
            conn: &mut PgConnection,
            event: &E,
        ) -> Result<Uuid> {
            let envelope = EventEnvelope::from_event(event)?;
            let id = envelope.id;
            self.record_envelopes_sync(conn, &[envelope])?;
            Ok(id)
        }

        /// Records `events` with one `INSERT` on a sync `conn`.
        ///
        /// # Errors
        /// As [`record`](Self::record).
        pub fn record_all_sync<E: DomainEvent>(
            &self,
            conn: &mut PgConnection,
            events: &[E],
        ) -> Result<Vec<Uuid>> {
            let envelopes = envelopes(events)?;
            self.record_envelopes_sync(conn, &envelopes)?;
            Ok(ids(&envelopes))
        }

        /// Records prepared envelopes on a sync `conn`.
        ///
        /// # Errors
        /// As [`record`](Self::record).
        pub fn record_envelopes_sync(
            &self,
            conn: &mut PgConnection,
            envelopes: &[EventEnvelope],
        ) -> Result<()> {
            let depth =
                AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_depth()?;
            if depth.is_none() {
                return Err(Error::NoTransaction);
            }
            if envelopes.is_empty() {
                return Ok(());
            }
            self.insert_query(envelopes)?.execute(conn)?;
            Ok(())
        }
    }
}
