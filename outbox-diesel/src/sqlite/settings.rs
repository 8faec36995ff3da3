//! [`SqliteSettings`]: what a SQLite outbox shares between its parts,
//! handing out the recorder, the inbox and the migrations configured alike.

use std::sync::Arc;

use super::sql::SqliteSql;
use super::{
    AsyncSqliteConnection, SqliteDeadLetters, SqliteInbox, SqliteOutbox, SqliteOutboxStore,
};
use crate::Result;

/// One value for everything a SQLite outbox's parts share: whether
/// statements are kept prepared. There is nothing to name: one database
/// file is one outbox, its tables unqualified.
///
/// ```no_run
/// # async fn f() -> outbox_diesel::Result<()> {
/// use outbox_diesel::sqlite::{self, SqliteSettings};
///
/// let mut conn = sqlite::connect("sqlite:///var/lib/shop/shop.db").await?;
/// let settings = SqliteSettings::default();
/// settings.migrate(&mut conn).await?;
/// let outbox = settings.outbox();
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct SqliteSettings {
    sql: Arc<SqliteSql>,
    prepare: bool,
}

impl std::fmt::Debug for SqliteSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteSettings")
            .field("prepare", &self.prepare)
            .finish()
    }
}

impl Default for SqliteSettings {
    /// Prepared statements on.
    fn default() -> Self {
        SqliteSettings {
            sql: SqliteSql::shared(),
            prepare: true,
        }
    }
}

impl SqliteSettings {
    /// Whether statements are kept prepared on each connection (diesel's
    /// statement cache; default on).
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepare = on;
        self
    }

    /// Whether statements are kept prepared.
    #[must_use]
    pub fn prepares_statements(&self) -> bool {
        self.prepare
    }

    /// The recorder.
    pub fn outbox(&self) -> SqliteOutbox {
        SqliteOutbox::from_sql(Arc::clone(&self.sql), self.prepare)
    }

    /// The inbox.
    pub fn inbox(&self) -> SqliteInbox {
        SqliteInbox::from_sql(Arc::clone(&self.sql), self.prepare)
    }

    /// The relay's store on `pool` (see [`SqliteOutboxStore`] for its
    /// settings and how its lease claim works).
    pub fn store(
        &self,
        pool: diesel_async::pooled_connection::deadpool::Pool<AsyncSqliteConnection>,
    ) -> SqliteOutboxStore {
        SqliteOutboxStore::new(pool, self.prepare)
    }

    /// The consumers' dead letters on `pool`
    /// ([`SqliteDeadLetters::new`]).
    pub fn dead_letters(
        &self,
        pool: diesel_async::pooled_connection::deadpool::Pool<AsyncSqliteConnection>,
    ) -> SqliteDeadLetters {
        SqliteDeadLetters::new(pool)
    }

    /// Applies the migrations this version knows, as
    /// [`migrate`](super::migrate) does.
    ///
    /// # Errors
    /// As [`migrate`](super::migrate).
    pub async fn migrate(&self, conn: &mut AsyncSqliteConnection) -> Result<Vec<i32>> {
        super::migrate::migrate(conn).await
    }
}
