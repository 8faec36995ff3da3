//! MariaDB (MySQL's protocol) for tests: a connection that says how to
//! start the server, and a database guard ([`TestMysqlDatabase`]) that
//! drops the test's database when the test ends, also when it panics.
//!
//! MySQL has no schemas inside a database: a test's tables live in a
//! database of its own, so the guard is a database, not a schema.
//!
//! # Why teardown kills sessions and retries
//!
//! `DROP DATABASE` waits for the metadata locks of open transactions on
//! its tables, for `lock_wait_timeout` (a year by default). A failed test
//! can leave such a session behind (a claim inside its transaction, a
//! pooled connection inside `BEGIN`), owned by a runtime that the guard's
//! `Drop` blocks. So teardown kills every other session using the database
//! (`information_schema.PROCESSLIST`), then drops it with a
//! `lock_wait_timeout` of 1 s, and tries again, up to [`TEARDOWN_TRIES`]
//! times. "Using" means the session's current database: a session of
//! another database that locks the test's tables by qualified name is not
//! killed, and the database is then left behind with a warning.

use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::{teardown, urls};

/// Attempts of a [`TestMysqlDatabase`]'s drop (kill, then drop with a 1 s
/// lock timeout) before it gives up.
pub const TEARDOWN_TRIES: u32 = 5;

/// A connection to `url`, or a panic saying where and how to start
/// MariaDB.
///
/// # Panics
/// When MariaDB does not answer at `url` (or refuses the login).
pub async fn connect(url: &str) -> AsyncMysqlConnection {
    AsyncMysqlConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("{}", urls::unreachable("MariaDB", url, &e)))
}

/// `` `name` ``: `name` as a quoted MySQL identifier.
///
/// ```
/// assert_eq!(outbox_testkit::mysql::quote("t_a"), "`t_a`");
/// assert_eq!(outbox_testkit::mysql::quote("a`b"), "`a``b`");
/// ```
pub fn quote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The number `sql` (a `SELECT COUNT(*) AS n ...`) counts.
///
/// # Panics
/// When the query fails.
pub async fn count(conn: &mut AsyncMysqlConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// A database of one test on the MariaDB server, created by
/// [`create`](Self::create) and dropped when the guard is dropped: at the
/// end of the test, also when it panics, with the sessions still using it
/// killed first.
///
/// ```no_run
/// # async fn f() {
/// use outbox_testkit::mysql::{self, TestMysqlDatabase};
/// use outbox_testkit::names::unique;
/// use outbox_testkit::urls::mysql_url;
///
/// let db = TestMysqlDatabase::create(&mysql_url(), unique("t", "claims")).await;
/// let conn = mysql::connect(db.url()).await;
/// # drop(conn);
/// # }
/// ```
pub struct TestMysqlDatabase {
    server_url: String,
    name: String,
    url: String,
}

impl std::fmt::Debug for TestMysqlDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestMysqlDatabase")
            .field("url", &urls::redact(&self.url))
            .finish_non_exhaustive()
    }
}

impl TestMysqlDatabase {
    /// Creates database `name` (`utf8mb4`) on the server of `server_url`
    /// (a URL of any of its databases).
    ///
    /// # Panics
    /// When MariaDB is not reachable (saying how to start it) or refuses.
    pub async fn create(server_url: &str, name: impl Into<String>) -> TestMysqlDatabase {
        let name = name.into();
        let database = TestMysqlDatabase {
            url: urls::with_database(server_url, &name),
            server_url: server_url.to_owned(),
            name,
        };
        connect(server_url)
            .await
            .batch_execute(&format!(
                "CREATE DATABASE {} CHARACTER SET utf8mb4",
                quote(&database.name)
            ))
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

impl Drop for TestMysqlDatabase {
    fn drop(&mut self) {
        let url = self.server_url.clone();
        let name = self.name.clone();
        let finished = teardown::run(&format!("MariaDB database {name}"), async move {
            for _ in 0..TEARDOWN_TRIES {
                if drop_database(&url, &name).await {
                    return;
                }
            }
            teardown::warn(&format!(
                "MariaDB database {name} left behind after {TEARDOWN_TRIES} attempts"
            ));
        });
        if !finished {
            teardown::warn(&format!(
                "MariaDB database {} may be left behind",
                self.name
            ));
        }
    }
}

#[derive(QueryableByName)]
struct Session {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// One attempt: kill the other sessions using database `name`, then drop
/// it with a 1 s lock wait. Whether it is gone.
async fn drop_database(url: &str, name: &str) -> bool {
    let Ok(mut conn) = AsyncMysqlConnection::establish(url).await else {
        return false;
    };
    let sessions: Vec<Session> = diesel::sql_query(
        "SELECT CAST(ID AS SIGNED) AS id FROM information_schema.PROCESSLIST \
         WHERE DB = ? AND ID <> CONNECTION_ID()",
    )
    .bind::<diesel::sql_types::Text, _>(name)
    .load(&mut conn)
    .await
    .unwrap_or_default();
    for session in sessions {
        // Gone already is as good as killed.
        let _ = conn.batch_execute(&format!("KILL {}", session.id)).await;
    }
    conn.batch_execute("SET SESSION lock_wait_timeout = 1")
        .await
        .is_ok()
        && conn
            .batch_execute(&format!("DROP DATABASE IF EXISTS {}", quote(name)))
            .await
            .is_ok()
}
