//! The SQLite back end on real database files (feature `sqlite`; SQLite is
//! compiled in, no server). Each test owns a file under the system's temp
//! directory, deleted when it ends, also when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admin;
mod commit;
mod dead_letters;
mod inbox;
mod migrate;
mod record;
mod store;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use outbox_diesel::sqlite::AsyncSqliteConnection;
use outbox_testkit::sqlite::TestSqliteFile;

/// A database file of the test's own, removed (with its WAL files) when
/// dropped, so also when the test panics.
struct TempDb(TestSqliteFile);

impl TempDb {
    fn new(test: &str) -> Self {
        TempDb(TestSqliteFile::temp("outbox_sqlite", test))
    }

    /// `sqlite://` and the file's path.
    fn url(&self) -> String {
        self.0.url()
    }
}

/// A file of the test's own, migrated, and a connection to it.
async fn migrated(test: &str) -> (TempDb, AsyncSqliteConnection) {
    let db = TempDb::new(test);
    let mut conn = outbox_diesel::sqlite::connect(&db.url()).await.unwrap();
    outbox_diesel::sqlite::migrate(&mut conn).await.unwrap();
    (db, conn)
}

#[derive(QueryableByName, Debug, PartialEq, Eq)]
struct Stored {
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    aggregate_id: String,
    #[diesel(sql_type = Text)]
    payload: String,
}

/// The outbox's rows, in seq order.
async fn stored(conn: &mut AsyncSqliteConnection) -> Vec<Stored> {
    diesel::sql_query("SELECT seq, id, aggregate_id, payload FROM outbox_events ORDER BY seq")
        .load(conn)
        .await
        .unwrap()
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// `SELECT count(*) AS n ...`'s count.
async fn count(conn: &mut AsyncSqliteConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap()
        .n
}
