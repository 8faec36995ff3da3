//! The database back end a scenario runs on: where its database is, how
//! it is created and removed, and the few statements that differ.

use std::path::PathBuf;

use diesel::QueryableByName;
use diesel::mysql::Mysql;
use diesel::pg::Pg;
use diesel::sqlite::Sqlite;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl};
use outbox::sqlite::AsyncSqliteConnection;
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::pg::TestSchema;
use outbox_testkit::sqlite::TestSqliteFile;

/// The database a scenario's outbox, inbox and business tables live in.
#[derive(Debug, Clone)]
pub enum Backend {
    /// PostgreSQL: a schema of the scenario on the server of
    /// [`Servers::database_url`](crate::Servers::database_url).
    Postgres,
    /// MariaDB: a database of the scenario on the shared server
    /// ([`outbox_testkit::urls::mysql_url`]), dropped at the end.
    Mariadb,
    /// SQLite: a database file of the scenario in `dir` (a test passes its
    /// `CARGO_TARGET_TMPDIR`), removed at the end with its WAL files.
    Sqlite {
        /// The directory of the database file.
        dir: PathBuf,
    },
}

impl Backend {
    /// `postgresql`, `mariadb` or `sqlite`: the name the summary line and
    /// the logs use.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Postgres => "postgresql",
            Backend::Mariadb => "mariadb",
            Backend::Sqlite { .. } => "sqlite",
        }
    }
}

/// A pool on the scenario's database, of its back end.
#[derive(Clone)]
pub(crate) enum Db {
    Pg(Pool<AsyncPgConnection>),
    Mysql(Pool<AsyncMysqlConnection>),
    Sqlite(Pool<AsyncSqliteConnection>),
}

impl Db {
    /// Loads the rows of `sql`.
    pub(crate) async fn load<T>(&self, sql: String) -> Result<Vec<T>, String>
    where
        T: QueryableByName<Pg> + QueryableByName<Mysql> + QueryableByName<Sqlite> + Send + 'static,
    {
        match self {
            Db::Pg(pool) => {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql).load::<T>(&mut conn).await
            }
            Db::Mysql(pool) => {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql).load::<T>(&mut conn).await
            }
            Db::Sqlite(pool) => {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql).load::<T>(&mut conn).await
            }
        }
        .map_err(|e| e.to_string())
    }

    /// Runs `sql`; the number of rows it changed.
    pub(crate) async fn execute(&self, sql: &str) -> Result<usize, String> {
        match self {
            Db::Pg(pool) => {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql).execute(&mut conn).await
            }
            Db::Mysql(pool) => {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql).execute(&mut conn).await
            }
            Db::Sqlite(pool) => {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql).execute(&mut conn).await
            }
        }
        .map_err(|e| e.to_string())
    }
}

/// Removes the scenario's database when dropped (also when the test
/// fails).
pub(crate) enum DatabaseGuard {
    /// PostgreSQL: drops the schema.
    Schema {
        /// Held: dropping it drops the schema.
        _schema: TestSchema,
    },
    /// MariaDB: kills the sessions still using the database, drops it.
    Mysql {
        /// Held: dropping it drops the database.
        _database: TestMysqlDatabase,
    },
    /// SQLite: removes the file and its WAL files.
    File {
        /// Held: dropping it deletes the file.
        _file: TestSqliteFile,
    },
}
