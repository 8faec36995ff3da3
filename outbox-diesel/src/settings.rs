//! [`PgSettings`]: one value for everything a PostgreSQL outbox shares
//! between its parts (schema, prepared statements, `NOTIFY`), which hands
//! out the recorder, the relay store's builder, the inbox and the dead
//! letters configured alike.

use std::sync::Arc;

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Pool;

use crate::schema::Schema;
use crate::sql::Sql;
use crate::{Outbox, PgDeadLetters, PgInbox, PgOutboxStore, PgOutboxStoreBuilder, Result};

/// The settings of one PostgreSQL outbox, shared by every part that works
/// on it: set the schema, prepared statements and `NOTIFY` once, then take
/// the parts from it.
///
/// | setting | default | used by |
/// |---|---|---|
/// | schema | `public` | every part |
/// | [`prepared_statements`](Self::prepared_statements) | on | recorder, store, inbox |
/// | [`notify`](Self::notify) | on | recorder |
///
/// Each part keeps its own setters (e.g. [`Outbox::notify`],
/// [`PgOutboxStoreBuilder::keep_sent`]) for what only it uses, and the
/// older entry points ([`crate::record`], [`Outbox::new`],
/// [`PgInbox::new`], [`PgOutboxStore::builder`]) stay as shorthands for
/// the defaults.
///
/// ```no_run
/// # async fn run() -> Result<(), outbox_diesel::Error> {
/// use outbox_diesel::PgSettings;
///
/// let url = "postgres://postgres@127.0.0.1:5432/app";
/// // Behind PgBouncer in transaction pooling mode before 1.21: once, here.
/// let settings = PgSettings::new("billing")?.prepared_statements(false);
/// outbox_diesel::migrate_url(url, settings.schema().name()).await?;
///
/// let pool = outbox_diesel::pool(url, 8)?;
/// let recorder = settings.outbox(); // record in the caller's transaction
/// let store = settings.store(pool.clone()).listen(url).build()?; // for the relay
/// let inbox = settings.inbox(); // consumer-side deduplication
/// # let _ = (recorder, store, inbox);
/// # Ok(()) }
/// ```
///
/// Other back ends get a value of the same shape (schema or database,
/// statement caching, wakeups) handing out the same parts.
#[derive(Clone)]
#[must_use]
pub struct PgSettings {
    /// The schema's SQL, rendered once and shared by every part.
    sql: Arc<Sql>,
    prepare: bool,
    notify: bool,
}

impl std::fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSettings")
            .field("schema", &self.sql.schema.name())
            .field("prepare", &self.prepare)
            .field("notify", &self.notify)
            .finish()
    }
}

impl Default for PgSettings {
    /// Schema `public`, prepared statements and `NOTIFY` on.
    fn default() -> Self {
        PgSettings {
            sql: Sql::public(),
            prepare: true,
            notify: true,
        }
    }
}

impl PgSettings {
    /// The outbox in `schema`, prepared statements and `NOTIFY` on.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for an invalid schema name.
    pub fn new(schema: &str) -> Result<Self> {
        Ok(PgSettings {
            sql: Sql::for_schema(&Schema::new(schema)?),
            ..PgSettings::default()
        })
    }

    /// Whether the statements of every part stay prepared on each
    /// connection (default on: one round trip per statement instead of
    /// two; see the crate docs). Turn it off behind PgBouncer in transaction
    /// pooling mode older than 1.21 (or without `max_prepared_statements`).
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepare = on;
        self
    }

    /// Whether recording sends a `NOTIFY` that wakes relays in other
    /// processes (default on; see [`Outbox::notify`] for its cost at high
    /// write rates).
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }

    /// The schema of this outbox.
    pub fn schema(&self) -> &Schema {
        &self.sql.schema
    }

    /// `true` when the parts keep their statements prepared.
    pub fn prepares_statements(&self) -> bool {
        self.prepare
    }

    /// `true` when recording sends a `NOTIFY`.
    pub fn notifies(&self) -> bool {
        self.notify
    }

    /// The recorder: records events in the caller's transaction.
    pub fn outbox(&self) -> Outbox {
        Outbox::from_sql(Arc::clone(&self.sql), self.notify, self.prepare)
    }

    /// The relay store's builder on `pool`, with this schema and prepared
    /// statement setting; store-only settings (`listen`, `claim_timeout`,
    /// …) are set on the builder. The store reuses this value's rendered
    /// SQL unless the builder is given another schema.
    pub fn store(&self, pool: Pool<AsyncPgConnection>) -> PgOutboxStoreBuilder {
        PgOutboxStore::builder(pool)
            .with_sql(Arc::clone(&self.sql))
            .prepared_statements(self.prepare)
    }

    /// The inbox, for consumer-side deduplication.
    pub fn inbox(&self) -> PgInbox {
        PgInbox::from_sql(Arc::clone(&self.sql)).prepared_statements(self.prepare)
    }

    /// The consumers' dead letters on `pool`.
    pub fn dead_letters(&self, pool: Pool<AsyncPgConnection>) -> PgDeadLetters {
        PgDeadLetters::from_sql(pool, Arc::clone(&self.sql))
    }

    /// The SQL every part shares (tests check that it is shared).
    #[cfg(test)]
    pub(crate) fn sql(&self) -> &Arc<Sql> {
        &self.sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_share_the_settings() -> Result<()> {
        let settings = PgSettings::new("billing")?
            .prepared_statements(false)
            .notify(false);
        let outbox = settings.outbox();
        assert_eq!(outbox.schema().name(), "billing");
        assert!(!outbox.notifies());
        assert!(!outbox.prepares_statements());
        assert!(!settings.inbox().prepares_statements());
        assert_eq!(settings.inbox().schema().name(), "billing");
        Ok(())
    }

    #[test]
    fn defaults_match_the_shorthands() {
        let settings = PgSettings::default();
        assert_eq!(settings.schema().name(), "public");
        let outbox = settings.outbox();
        let shorthand = Outbox::default();
        assert_eq!(outbox.schema().name(), shorthand.schema().name());
        assert_eq!(outbox.notifies(), shorthand.notifies());
        assert_eq!(
            outbox.prepares_statements(),
            shorthand.prepares_statements()
        );
    }

    #[test]
    fn parts_share_one_rendering() -> Result<()> {
        let settings = PgSettings::new("billing")?.notify(false);
        let sql = settings.sql();
        assert!(Arc::ptr_eq(sql, &settings.outbox().sql));
        assert!(Arc::ptr_eq(sql, &settings.outbox().notify(true).sql));
        assert!(Arc::ptr_eq(sql, &settings.inbox().sql));
        assert!(Arc::ptr_eq(
            sql,
            &settings.clone().prepared_statements(false).inbox().sql
        ));
        // A schema is rendered once per settings value, not per part.
        assert!(!Arc::ptr_eq(sql, PgSettings::new("billing")?.sql()));
        assert!(Arc::ptr_eq(
            PgSettings::default().sql(),
            &Outbox::default().sql
        ));
        assert!(Arc::ptr_eq(
            PgSettings::default().sql(),
            &PgInbox::default().sql
        ));
        Ok(())
    }

    #[test]
    fn the_store_shares_the_rendering_unless_its_schema_changes() -> Result<()> {
        // The pool connects lazily: nothing here needs a server.
        let pool = crate::pool("postgres://postgres@127.0.0.1:1/none", 1)?;
        let settings = PgSettings::new("billing")?;
        let store = settings.store(pool.clone()).build()?;
        assert!(Arc::ptr_eq(settings.sql(), store.shared_sql()));
        assert_eq!(store.schema().name(), "billing");
        let other = settings.store(pool).schema("other").build()?;
        assert_eq!(other.schema().name(), "other");
        assert_eq!(other.shared_sql().schema.name(), "other");
        Ok(())
    }

    #[test]
    fn invalid_schema_is_refused() {
        assert!(matches!(PgSettings::new(""), Err(crate::Error::Config(_))));
    }
}
