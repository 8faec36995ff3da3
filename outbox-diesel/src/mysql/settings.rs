//! [`MysqlSettings`]: what a MariaDB outbox shares between its parts (the
//! database, prepared statements), handing out the recorder, the inbox
//! and the migrations configured alike.

use std::sync::Arc;

use diesel_async::AsyncMysqlConnection;

use super::sql::MysqlSql;
use super::{MysqlDeadLetters, MysqlInbox, MysqlOutbox, MysqlOutboxStore};
use crate::Result;

/// One value for everything a MariaDB outbox's parts share: the database
/// the tables live in and whether statements are kept prepared. Its SQL is
/// rendered once, here, and shared by every part it hands out.
///
/// ```no_run
/// # async fn f() -> outbox_diesel::Result<()> {
/// use outbox_diesel::mysql::{self, MysqlSettings};
///
/// let mut conn = mysql::connect("mysql://shop:secret@127.0.0.1/shop").await?;
/// let settings = MysqlSettings::default(); // the tables of `shop`, the URL's database
/// settings.migrate(&mut conn).await?;
/// let outbox = settings.outbox();
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct MysqlSettings {
    sql: Arc<MysqlSql>,
    prepare: bool,
}

impl std::fmt::Debug for MysqlSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlSettings")
            .field("database", &self.sql.database)
            .field("prepare", &self.prepare)
            .finish()
    }
}

impl Default for MysqlSettings {
    /// The connection's own database (its URL's), prepared statements on.
    fn default() -> Self {
        MysqlSettings {
            sql: MysqlSql::default_database(),
            prepare: true,
        }
    }
}

impl MysqlSettings {
    /// The outbox's tables in `database` (on the connection's server),
    /// whatever database the connection uses.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) if `database` is empty,
    /// longer than 64 bytes or contains NUL.
    pub fn new(database: &str) -> Result<Self> {
        Ok(MysqlSettings {
            sql: Arc::new(MysqlSql::new(Some(database))?),
            prepare: true,
        })
    }

    /// Whether statements are kept prepared on each connection (default
    /// on). Turn it off behind a proxy that cannot keep them.
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepare = on;
        self
    }

    /// The database named by [`new`](Self::new); `None`: the connection's.
    #[must_use]
    pub fn database(&self) -> Option<&str> {
        self.sql.database.as_deref()
    }

    /// Whether statements are kept prepared.
    #[must_use]
    pub fn prepares_statements(&self) -> bool {
        self.prepare
    }

    /// The recorder.
    pub fn outbox(&self) -> MysqlOutbox {
        MysqlOutbox::from_sql(Arc::clone(&self.sql), self.prepare)
    }

    /// The relay's store on `pool` (see [`MysqlOutboxStore`] for its
    /// settings).
    pub fn store(
        &self,
        pool: diesel_async::pooled_connection::deadpool::Pool<AsyncMysqlConnection>,
    ) -> MysqlOutboxStore {
        MysqlOutboxStore::new(pool, Arc::clone(&self.sql), self.prepare)
    }

    /// The inbox.
    pub fn inbox(&self) -> MysqlInbox {
        MysqlInbox::from_sql(Arc::clone(&self.sql), self.prepare)
    }

    /// Consumers' dead letters in the settings' database, on `pool`.
    pub fn dead_letters(
        &self,
        pool: diesel_async::pooled_connection::deadpool::Pool<AsyncMysqlConnection>,
    ) -> MysqlDeadLetters {
        MysqlDeadLetters::from_sql(pool, &self.sql)
    }

    /// Applies the migrations this version knows to the settings'
    /// database, as [`migrate`](super::migrate) does.
    ///
    /// # Errors
    /// As [`migrate`](super::migrate).
    pub async fn migrate(&self, conn: &mut AsyncMysqlConnection) -> Result<Vec<i32>> {
        super::migrate::run(conn, &self.sql).await
    }
}
