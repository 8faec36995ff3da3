//! `commit_top_level` and `PgTransaction` commit only a real top-level
//! `COMMIT` of a healthy transaction: a nested transaction left open by a
//! cancelled future, or a transaction aborted by a failed statement, is
//! refused with the reason and rolled back (its connection closed, not
//! pooled); a healthy one commits and its connection is pooled again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestDb;
use diesel::sql_types::Integer;
use diesel_async::{AsyncConnection as _, AsyncPgConnection, RunQueryDsl};
use outbox_diesel::{Error, PgTransaction};
use outbox_testkit::eventually::eventually;

async fn pid(conn: &mut AsyncPgConnection) -> i32 {
    outbox_testkit::pg::backend_pid(conn).await
}

/// A fresh test table `t` in the test's schema.
fn table(db: &TestDb) {
    db.execute(
        "CREATE TABLE {schema}.t (
             id int PRIMARY KEY,
             parent int REFERENCES {schema}.t (id) DEFERRABLE INITIALLY DEFERRED
         )",
    );
}

async fn insert(conn: &mut AsyncPgConnection, db: &TestDb, id: i32, parent: Option<i32>) {
    diesel::sql_query(format!(
        "INSERT INTO \"{}\".t (id, parent) VALUES ($1, $2)",
        db.schema
    ))
    .bind::<Integer, _>(id)
    .bind::<diesel::sql_types::Nullable<Integer>, _>(parent)
    .execute(conn)
    .await
    .unwrap();
}

/// Waits (up to 5 s) until backend `pid` is gone.
async fn assert_closed(db: &TestDb, pid: i32) {
    eventually(format!(
        "backend {pid} gone (not pooled inside its transaction)"
    ))
    .within(Duration::from_secs(5))
    .equals(0, || std::future::ready(backends(db, pid)))
    .await;
}

fn backends(db: &TestDb, pid: i32) -> i64 {
    outbox_testkit::pg::count_sync(
        &mut db.sync_conn(),
        &format!("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = {pid}"),
    )
}

#[tokio::test]
async fn a_healthy_transaction_commits_and_its_connection_is_pooled_again() {
    let db = TestDb::new("commit_ok").await;
    table(&db);
    let mut tx = PgTransaction::begin(&db.pool).await.unwrap();
    let before = pid(&mut tx).await;
    insert(&mut tx, &db, 1, None).await;
    tx.commit().await.unwrap();
    assert_eq!(db.count("t", ""), 1);

    // The same connection, outside any transaction, serves the next one.
    let mut tx = PgTransaction::begin(&db.pool).await.unwrap();
    assert_eq!(pid(&mut tx).await, before, "pooled, not closed");
    tx.rollback().await.unwrap();
    let mut conn = db.pool.get().await.unwrap();
    assert!(
        !outbox_diesel::in_top_level_transaction(&mut *conn),
        "diesel knows the transaction ended"
    );
}

#[tokio::test]
async fn a_nested_transaction_left_open_is_not_committed() {
    let db = TestDb::new("commit_nested").await;
    table(&db);
    let mut tx = PgTransaction::begin(&db.pool).await.unwrap();
    let backend = pid(&mut tx).await;
    insert(&mut tx, &db, 1, None).await;
    let schema = db.schema.clone();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        tx.transaction::<_, diesel::result::Error, _>(async move |conn| {
            diesel::sql_query(format!("INSERT INTO \"{schema}\".t (id) VALUES (2)"))
                .execute(conn)
                .await?;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }),
    )
    .await;
    assert!(cancelled.is_err());
    assert!(!outbox_diesel::in_top_level_transaction(&mut *tx));

    let error = tx.commit().await.unwrap_err();
    assert!(
        matches!(&error, Error::NotCommitted { source: None, .. }),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(text.contains("1 nested transaction(s)"), "{text}");
    assert_eq!(db.count("t", ""), 0, "nothing committed");
    assert_closed(&db, backend).await;
}

#[tokio::test]
async fn an_aborted_transaction_is_not_committed() {
    let db = TestDb::new("commit_aborted").await;
    table(&db);
    let mut tx = PgTransaction::begin(&db.pool).await.unwrap();
    let backend = pid(&mut tx).await;
    insert(&mut tx, &db, 1, None).await;
    // A failed statement, its error ignored: PostgreSQL aborted the
    // transaction, diesel does not know.
    assert!(
        diesel::sql_query("SELECT 1 / 0")
            .execute(&mut *tx)
            .await
            .is_err()
    );
    assert!(outbox_diesel::in_top_level_transaction(&mut *tx));

    let error = tx.commit().await.unwrap_err();
    assert!(
        matches!(
            &error,
            Error::NotCommitted {
                source: Some(_),
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("aborted"), "{error}");
    assert_eq!(db.count("t", ""), 0);
    assert_closed(&db, backend).await;
}

#[tokio::test]
async fn a_failing_commit_is_a_database_error() {
    let db = TestDb::new("commit_fails").await;
    table(&db);
    let mut tx = PgTransaction::begin(&db.pool).await.unwrap();
    let backend = pid(&mut tx).await;
    // The deferred foreign key fails at COMMIT, not before.
    insert(&mut tx, &db, 1, Some(99)).await;
    let error = tx.commit().await.unwrap_err();
    assert!(matches!(error, Error::Database(_)), "{error:?}");
    assert_eq!(db.count("t", ""), 0);
    assert_closed(&db, backend).await;
}

#[tokio::test]
async fn rolling_back_with_a_nested_transaction_open_closes_the_connection() {
    let db = TestDb::new("rollback_nested").await;
    table(&db);
    let mut tx = PgTransaction::begin(&db.pool).await.unwrap();
    let backend = pid(&mut tx).await;
    insert(&mut tx, &db, 1, None).await;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        tx.transaction::<_, diesel::result::Error, _>(async |_conn| {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }),
    )
    .await;
    assert!(cancelled.is_err());
    tx.rollback().await.unwrap();
    assert_closed(&db, backend).await;
    assert_eq!(db.count("t", ""), 0);
}
