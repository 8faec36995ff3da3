//! PostgreSQL for tests: a connection that says how to start the server,
//! a schema guard ([`TestSchema`]) and a database guard ([`TestDatabase`])
//! that remove what the test made when it ends, also when it panics, and
//! counting helpers.
//!
//! # Why teardown terminates backends and retries
//!
//! `DROP SCHEMA ... CASCADE` waits for every lock on the schema's tables.
//! When a test fails, sessions of its own may still hold some: a relay's
//! claim (`FOR UPDATE`), a consumer's transaction, a pooled connection
//! inside `BEGIN`. Their tasks belong to the test's runtime, which the
//! guard's `Drop` is blocking (or which is shutting down), so they would
//! never let go and the drop would hang the test. So teardown first
//! terminates every other backend holding a lock in the schema
//! (`pg_terminate_backend` over `pg_locks`), then drops it with a
//! `lock_timeout` of 1 s; a session that took a new lock in between (a
//! consumer task still running while the test unwinds) makes that attempt
//! time out instead of waiting, and the whole is tried again, up to
//! [`TEARDOWN_TRIES`] times, within 10 s in all.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel::QueryableByName;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::{names, teardown, urls};

/// Attempts of [`drop_schema`] (terminate, then drop with a 1 s lock
/// timeout) before it gives up.
pub const TEARDOWN_TRIES: u32 = 5;

/// Connections of a [`TestSchema`]'s pool.
pub const POOL_SIZE: usize = 8;

/// A connection to `url`, or a panic saying where and how to start
/// PostgreSQL. Plaintext (the kit speaks no TLS): TLS tests connect with
/// the library.
///
/// # Panics
/// When PostgreSQL does not answer at `url`.
pub async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("{}", urls::unreachable("PostgreSQL", url, &e)))
}

/// `"name"`: `name` as a quoted SQL identifier.
///
/// ```
/// assert_eq!(outbox_testkit::pg::quote("t_a"), "\"t_a\"");
/// assert_eq!(outbox_testkit::pg::quote("a\"b"), "\"a\"\"b\"");
/// ```
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'`: `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
}

/// The server process id of `conn`'s session (`pg_backend_pid()`), to find
/// it in `pg_stat_activity` or `pg_locks`.
///
/// # Panics
/// When the query fails.
pub async fn backend_pid(conn: &mut AsyncPgConnection) -> i32 {
    diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(conn)
        .await
        .unwrap_or_else(|e| panic!("pg_backend_pid(): {e}"))
        .pid
}

/// The `n` column of the first row of `sql` (`SELECT count(*) AS n ...`).
///
/// # Panics
/// When the query fails (the panic names it).
pub async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// [`count`] on a synchronous connection.
///
/// # Panics
/// When the query fails (the panic names it).
pub fn count_sync(conn: &mut diesel::PgConnection, sql: &str) -> i64 {
    diesel::RunQueryDsl::get_result::<Count>(diesel::sql_query(sql), conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// A schema of one test, removed when the guard is dropped: at the end of
/// the test, also when it panics, whether or not a runtime is running.
///
/// The name comes from [`names::unique`] (or is the caller's own); the
/// guard holds a pool of [`POOL_SIZE`] connections on the database (queries
/// name the schema: `"{schema}".table`, see [`TestSchema::sql`]).
///
/// ```no_run
/// # async fn f() {
/// use outbox_testkit::pg::TestSchema;
///
/// let schema = TestSchema::new("t", "orders_are_kept").await;
/// schema.run(&schema.sql("CREATE TABLE {schema}.orders (id int)")).await;
/// assert_eq!(schema.count("SELECT count(*) AS n FROM {schema}.orders").await, 0);
/// # }
/// ```
pub struct TestSchema {
    url: String,
    name: String,
    pool: Pool<AsyncPgConnection>,
}

impl std::fmt::Debug for TestSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestSchema")
            .field("url", &urls::redact(&self.url))
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TestSchema {
    /// Creates the schema `<prefix>_<test>_<pid>_<n>` on the shared
    /// database ([`urls::database_url`]).
    ///
    /// # Panics
    /// When PostgreSQL is not reachable (saying how to start it) or refuses.
    pub async fn new(prefix: &str, test: &str) -> TestSchema {
        TestSchema::create(&urls::database_url(), names::unique(prefix, test)).await
    }

    /// Creates schema `name` on the database at `url`.
    ///
    /// # Panics
    /// When PostgreSQL is not reachable (saying how to start it) or refuses.
    pub async fn create(url: &str, name: impl Into<String>) -> TestSchema {
        let schema = TestSchema::reserve(url, name);
        connect(url)
            .await
            .batch_execute(&format!("CREATE SCHEMA {}", quote(&schema.name)))
            .await
            .unwrap_or_else(|e| panic!("creating schema {}: {e}", schema.name));
        schema
    }

    /// Schema `name` on the database at `url`, not created (the test, or
    /// the code under test, creates it: migrations do), and dropped all the
    /// same.
    pub fn reserve(url: &str, name: impl Into<String>) -> TestSchema {
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(url);
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(10)))
            .build()
            .unwrap_or_else(|e| panic!("a pool on {}: {e}", urls::redact(url)));
        TestSchema {
            url: url.to_owned(),
            name: name.into(),
            pool,
        }
    }

    /// The schema's name (unquoted).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A pool of [`POOL_SIZE`] plaintext connections on the database, for
    /// the test's own queries (connections open on first use).
    pub fn pool(&self) -> &Pool<AsyncPgConnection> {
        &self.pool
    }

    /// `sql` with every `{schema}` replaced by the quoted schema name.
    pub fn sql(&self, sql: &str) -> String {
        sql.replace("{schema}", &quote(&self.name))
    }

    /// A connection from the pool.
    ///
    /// # Panics
    /// When none can be had (the panic says why and how to start the
    /// server).
    pub async fn conn(
        &self,
    ) -> diesel_async::pooled_connection::deadpool::Object<AsyncPgConnection> {
        self.pool
            .get()
            .await
            .unwrap_or_else(|e| panic!("{}", urls::unreachable("PostgreSQL", &self.url, &e)))
    }

    /// Runs `sql` (after [`sql`](Self::sql)); panics with the error.
    pub async fn run(&self, sql: &str) {
        let sql = self.sql(sql);
        self.conn()
            .await
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// [`count`] of `sql` (after [`sql`](Self::sql)).
    pub async fn count(&self, sql: &str) -> i64 {
        count(&mut *self.conn().await, &self.sql(sql)).await
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        drop_schema(&self.url, &self.name);
    }
}

/// Removes schema `name` from the database at `url`, as a [`TestSchema`]
/// does when dropped: terminates the other sessions holding locks in it,
/// drops it with a 1 s `lock_timeout`, tries again up to
/// [`TEARDOWN_TRIES`] times, all within 10 s. Blocks until done; callable
/// inside or outside a runtime. Returns whether the schema is gone.
pub fn drop_schema(url: &str, name: &str) -> bool {
    let url = url.to_owned();
    let sql = format!(
        "SET lock_timeout = '1s'; \
         SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
         JOIN pg_class c ON c.oid = l.relation \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE n.nspname = {} AND l.pid <> pg_backend_pid() \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND a.backend_type = 'client backend' AND a.usename = current_user; \
         DROP SCHEMA IF EXISTS {} CASCADE;",
        literal(name),
        quote(name)
    );
    let done = Arc::new(AtomicBool::new(false));
    let dropped = Arc::clone(&done);
    teardown::run(&format!("schema {name}"), async move {
        for _ in 0..TEARDOWN_TRIES {
            let Ok(mut conn) = AsyncPgConnection::establish(&url).await else {
                break;
            };
            if conn.batch_execute(&sql).await.is_ok() {
                dropped.store(true, Ordering::Relaxed);
                break;
            }
        }
    });
    let done = AtomicBool::load(&done, Ordering::Relaxed);
    if !done {
        teardown::warn(&format!("schema {name} may be left behind"));
    }
    done
}

/// A database of one test (for code that runs against a database of its
/// own, e.g. the example's processes), dropped `WITH (FORCE)` when the
/// guard is dropped, also when the test panics.
pub struct TestDatabase {
    server_url: String,
    name: String,
    url: String,
}

impl std::fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDatabase")
            .field("url", &urls::redact(&self.url))
            .finish_non_exhaustive()
    }
}

impl TestDatabase {
    /// Database `name` on the server of `server_url` (a URL of any of its
    /// databases), not created: the code under test creates it. Dropped
    /// all the same.
    pub fn reserve(server_url: &str, name: impl Into<String>) -> TestDatabase {
        let name = name.into();
        TestDatabase {
            url: urls::with_database(server_url, &name),
            server_url: server_url.to_owned(),
            name,
        }
    }

    /// Creates database `name` on the server of `server_url`.
    ///
    /// # Panics
    /// When PostgreSQL is not reachable (saying how to start it) or refuses.
    pub async fn create(server_url: &str, name: impl Into<String>) -> TestDatabase {
        let database = TestDatabase::reserve(server_url, name);
        connect(server_url)
            .await
            .batch_execute(&format!("CREATE DATABASE {}", quote(&database.name)))
            .await
            .unwrap_or_else(|e| panic!("creating database {}: {e}", database.name));
        database
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of the database itself.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let url = self.server_url.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote(&self.name));
        teardown::run(&format!("database {}", self.name), async move {
            if let Ok(mut conn) = AsyncPgConnection::establish(&url).await {
                let _ = conn.batch_execute(&sql).await;
            }
        });
    }
}
