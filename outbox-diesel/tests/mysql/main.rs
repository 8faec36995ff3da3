//! The MariaDB back end against a real MariaDB server (feature `mysql`;
//! `scripts/dev-services` starts one, `MYSQL_URL` points elsewhere). Each
//! test owns a database of its own, dropped when it ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admin;
mod commit;
mod dead_letters;
mod inbox;
mod migrate;
mod pool;
mod record;
mod store;
mod tls;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names::unique;
use outbox_testkit::urls::mysql_url;

/// A database of the test's own, migrated, and a connection to it.
async fn migrated(test: &str) -> (TestMysqlDatabase, AsyncMysqlConnection) {
    let db = TestMysqlDatabase::create(&mysql_url(), unique("my", test)).await;
    let mut conn = outbox_diesel::mysql::connect(db.url()).await.unwrap();
    outbox_diesel::mysql::migrate(&mut conn).await.unwrap();
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
async fn stored(conn: &mut AsyncMysqlConnection) -> Vec<Stored> {
    diesel::sql_query("SELECT seq, id, aggregate_id, payload FROM outbox_events ORDER BY seq")
        .load(conn)
        .await
        .unwrap()
}

/// `SELECT COUNT(*) AS n ...`'s count.
async fn count(conn: &mut AsyncMysqlConnection, sql: &str) -> i64 {
    outbox_testkit::mysql::count(conn, sql).await
}
