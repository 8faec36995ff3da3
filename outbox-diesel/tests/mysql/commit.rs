//! The checked commit on MariaDB: a transaction that a deadlock rolled back
//! (the statements after it autocommit) is never reported committed and
//! records nothing; nested transactions left open are refused;
//! `MysqlTransaction` commits, rolls back, and rolls back when dropped.

use std::time::Duration;

use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_core::testing::TestEvent;
use outbox_diesel::mysql::{self, MysqlTransaction};
use outbox_diesel::{Error, begin_top_level, commit_top_level};

use super::{count, migrated, stored};

async fn update(conn: &mut AsyncMysqlConnection, id: i32, v: i32) -> diesel::QueryResult<usize> {
    diesel::sql_query(format!("UPDATE t SET v = {v} WHERE id = {id}"))
        .execute(conn)
        .await
}

fn is_deadlock(result: &diesel::QueryResult<usize>) -> bool {
    matches!(result, Err(e) if e.to_string().contains("Deadlock"))
}

/// Two transactions lock rows 1 and 2 in opposite orders: InnoDB rolls one
/// back whole. Its handler "swallows" the error and records an event, then
/// commits: the event is refused (not autocommitted) and the commit says
/// the transaction is lost.
#[tokio::test]
async fn a_transaction_lost_to_a_deadlock_records_nothing_and_does_not_commit() {
    let (db, mut a) = migrated("deadlock").await;
    a.batch_execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL); INSERT INTO t VALUES (1, 0), (2, 0)",
    )
    .await
    .unwrap();
    let mut b = mysql::connect(db.url()).await.unwrap();
    begin_top_level(&mut a).await.unwrap();
    begin_top_level(&mut b).await.unwrap();
    update(&mut a, 1, 1).await.unwrap();
    update(&mut b, 2, 2).await.unwrap();
    let crossing = tokio::spawn(async move {
        let result = update(&mut a, 2, 1).await;
        (a, result)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_result = update(&mut b, 1, 2).await;
    let (a, a_result) = crossing.await.unwrap();
    let (mut victim, mut survivor) = match (is_deadlock(&a_result), is_deadlock(&b_result)) {
        (true, false) => (a, b),
        (false, true) => (b, a),
        other => panic!("expected one deadlock victim, got {other:?}: {a_result:?} {b_result:?}"),
    };
    let error = mysql::record(&mut victim, &TestEvent::new("o-1"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
    let error = mysql::record_all(&mut victim, &[TestEvent::new("o-2"), TestEvent::new("o-3")])
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
    let error = outbox_core::InboxStore::receive(
        &outbox_diesel::mysql::MysqlInbox::default(),
        &mut victim,
        "billing",
        uuid::Uuid::now_v7(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
    let error = commit_top_level(&mut victim).await.unwrap_err();
    assert!(
        matches!(&error, Error::NotCommitted { reason, .. } if reason.contains("rolled the transaction back")),
        "{error}"
    );
    commit_top_level(&mut survivor).await.unwrap();
    assert!(
        stored(&mut survivor).await.is_empty(),
        "no event autocommitted"
    );
}

#[tokio::test]
async fn a_nested_transaction_left_open_is_refused() {
    let (db, mut conn) = migrated("nested").await;
    begin_top_level(&mut conn).await.unwrap();
    mysql::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap();
    // A savepoint, as a cancelled `conn.transaction(..)` leaves it.
    <diesel_async::AnsiTransactionManager as diesel_async::TransactionManager<_>>::begin_transaction(&mut conn)
        .await
        .unwrap();
    let error = commit_top_level(&mut conn).await.unwrap_err();
    assert!(
        matches!(&error, Error::NotCommitted { reason, .. } if reason.contains("nested")),
        "{error}"
    );
    drop(conn);
    let mut other = mysql::connect(db.url()).await.unwrap();
    assert!(stored(&mut other).await.is_empty());
}

#[tokio::test]
async fn mysql_transactions_commit_roll_back_and_roll_back_when_dropped() {
    let (db, mut conn) = migrated("tx").await;
    let pool = mysql::pool(db.url(), 2).unwrap();

    let mut tx = MysqlTransaction::begin(&pool).await.unwrap();
    mysql::record(&mut tx, &TestEvent::new("kept"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = MysqlTransaction::begin(&pool).await.unwrap();
    mysql::record(&mut tx, &TestEvent::new("rolled-back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let mut tx = MysqlTransaction::begin(&pool).await.unwrap();
    mysql::record(&mut tx, &TestEvent::new("dropped"))
        .await
        .unwrap();
    drop(tx);

    let rows = stored(&mut conn).await;
    let aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(aggregates, ["kept"]);
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_events").await,
        1
    );
    // The pool still hands out working connections.
    let mut pooled = pool.get().await.unwrap();
    assert_eq!(stored(&mut pooled).await.len(), 1);
}

/// A transaction begun by a plain `BEGIN` has no savepoint to check: the
/// commit refuses it and says how to begin it, rather than claiming the
/// server rolled it back.
#[tokio::test]
async fn a_transaction_not_begun_by_begin_top_level_is_refused_with_the_reason() {
    let (_db, mut conn) = migrated("plainbegin").await;
    <diesel_async::AnsiTransactionManager as diesel_async::TransactionManager<_>>::begin_transaction(
        &mut conn,
    )
    .await
    .unwrap();
    let error = commit_top_level(&mut conn).await.unwrap_err();
    assert!(
        matches!(&error, Error::NotCommitted { reason, .. } if reason.contains("begin_top_level")),
        "{error}"
    );
}

/// A session with autocommit off would start a new transaction silently
/// after a deadlock: recording is refused there.
#[tokio::test]
async fn a_session_without_autocommit_is_refused() {
    let (_db, mut conn) = migrated("noautocommit").await;
    conn.batch_execute("SET autocommit = 0").await.unwrap();
    begin_top_level(&mut conn).await.unwrap();
    let error = mysql::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::NotCommitted { reason, .. } if reason.contains("autocommit")),
        "{error}"
    );
}

/// The server closes every pooled connection (`wait_timeout`, a restart,
/// `KILL`): the pool notices on checkout and opens new ones, instead of
/// handing out dead connections for ever.
#[tokio::test]
async fn the_pool_replaces_connections_the_server_closed() {
    let (db, mut admin) = migrated("killed").await;
    let pool = mysql::pool(db.url(), 2).unwrap();
    for _ in 0..2 {
        let tx = MysqlTransaction::begin(&pool).await.unwrap();
        tx.commit().await.unwrap();
    }
    let ids: Vec<Id> = diesel::sql_query(format!(
        "SELECT ID AS id FROM information_schema.PROCESSLIST \
         WHERE DB = '{}' AND ID <> CONNECTION_ID()",
        db.name()
    ))
    .load(&mut admin)
    .await
    .unwrap();
    assert!(!ids.is_empty(), "the pool's connections are open");
    for id in ids {
        admin
            .batch_execute(&format!("KILL CONNECTION {}", id.id))
            .await
            .unwrap();
    }
    for i in 0..4 {
        let mut tx = MysqlTransaction::begin(&pool)
            .await
            .unwrap_or_else(|e| panic!("checkout {i} after the kill: {e}"));
        mysql::record(&mut tx, &TestEvent::new("after"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    assert_eq!(stored(&mut admin).await.len(), 4);
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}
