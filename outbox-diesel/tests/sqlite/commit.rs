//! The checked commit on SQLite: a transaction SQLite rolled back (the
//! statements after it autocommit) is never reported committed; a failed
//! statement rolls back only itself; nested transactions left open are
//! refused; `SqliteTransaction` commits, rolls back, and rolls back when
//! dropped; a writer waits for another (`busy_timeout`) instead of failing.

use std::time::{Duration, Instant};

use diesel_async::sync_connection_wrapper::SyncTransactionManagerWrapper;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection, TransactionManager};
use outbox_core::testing::TestEvent;
use outbox_diesel::sqlite::{self, AsyncSqliteConnection, SqliteTransaction};
use outbox_diesel::{Error, begin_top_level, commit_top_level};

use super::{count, migrated, stored};

type Manager = SyncTransactionManagerWrapper<diesel::connection::AnsiTransactionManager>;

/// A table whose inserts roll the whole transaction back.
pub(crate) async fn roll_back_by_trigger_setup(conn: &mut AsyncSqliteConnection) {
    conn.batch_execute(
        "CREATE TABLE doomed (v INTEGER); \
         CREATE TRIGGER doomed_rolls_back BEFORE INSERT ON doomed \
         BEGIN SELECT RAISE(ROLLBACK, 'rolled back by the test'); END",
    )
    .await
    .unwrap();
}

/// A statement that fails and makes SQLite roll the transaction back; the
/// caller "swallows" the error. (Through `sql_query`, as an application's
/// statements run: diesel still counts the transaction open.)
pub(crate) async fn roll_back_by_trigger(conn: &mut AsyncSqliteConnection) {
    let error = diesel::sql_query("INSERT INTO doomed (v) VALUES (1)")
        .execute(conn)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("rolled back by the test"),
        "{error}"
    );
    assert!(outbox_diesel::in_top_level_transaction(conn));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_sqlite_rolled_back_is_not_reported_committed() {
    let (_db, mut conn) = migrated("lostcommit").await;
    roll_back_by_trigger_setup(&mut conn).await;
    conn.batch_execute("CREATE TABLE t (v INTEGER)")
        .await
        .unwrap();
    begin_top_level(&mut conn).await.unwrap();
    conn.batch_execute("INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    roll_back_by_trigger(&mut conn).await;
    // Autocommitted on its own: SQLite has no transaction any more.
    diesel::sql_query("INSERT INTO t VALUES (2)")
        .execute(&mut conn)
        .await
        .unwrap();
    let error = commit_top_level(&mut conn).await.unwrap_err();
    assert!(
        matches!(&error, Error::NotCommitted { reason, .. } if reason.contains("rolled the transaction back")),
        "{error}"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM t WHERE v = 1").await,
        0
    );
}

/// As on MariaDB (and unlike PostgreSQL): a statement that fails on a
/// constraint rolls back only itself; a caller that goes on commits the
/// rest. Documented on `Connection`.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_statement_rolls_back_only_itself() {
    let (_db, mut conn) = migrated("stmt").await;
    begin_top_level(&mut conn).await.unwrap();
    sqlite::record(&mut conn, &TestEvent::new("kept"))
        .await
        .unwrap();
    diesel::sql_query("INSERT INTO outbox_settings (singleton) VALUES (1)")
        .execute(&mut conn)
        .await
        .unwrap_err();
    commit_top_level(&mut conn).await.unwrap();
    assert_eq!(stored(&mut conn).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nested_transaction_left_open_is_refused() {
    let (db, mut conn) = migrated("nested").await;
    begin_top_level(&mut conn).await.unwrap();
    sqlite::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap();
    // A savepoint, as a cancelled `conn.transaction(..)` leaves it.
    Manager::begin_transaction(&mut conn).await.unwrap();
    let error = commit_top_level(&mut conn).await.unwrap_err();
    assert!(
        matches!(&error, Error::NotCommitted { reason, .. } if reason.contains("nested")),
        "{error}"
    );
    drop(conn);
    let mut other = sqlite::connect(&db.url()).await.unwrap();
    assert!(stored(&mut other).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn commit_outside_a_transaction_is_refused() {
    let (_db, mut conn) = migrated("notx").await;
    let error = commit_top_level(&mut conn).await.unwrap_err();
    assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_transactions_commit_roll_back_and_roll_back_when_dropped() {
    let (db, mut conn) = migrated("tx").await;
    let pool = sqlite::pool(&db.url(), 2).unwrap();

    let mut tx = SqliteTransaction::begin(&pool).await.unwrap();
    sqlite::record(&mut tx, &TestEvent::new("kept"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = SqliteTransaction::begin(&pool).await.unwrap();
    sqlite::record(&mut tx, &TestEvent::new("rolled-back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let mut tx = SqliteTransaction::begin(&pool).await.unwrap();
    sqlite::record(&mut tx, &TestEvent::new("dropped"))
        .await
        .unwrap();
    drop(tx);

    let rows = stored(&mut conn).await;
    let aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(aggregates, ["kept"]);
    // The pool still hands out working connections, and the dropped
    // transaction's write lock is gone.
    let mut tx = SqliteTransaction::begin(&pool).await.unwrap();
    sqlite::record(&mut tx, &TestEvent::new("after"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut pooled = pool.get().await.unwrap();
    assert_eq!(stored(&mut pooled).await.len(), 2);
}

/// One connection holds the write lock (`BEGIN IMMEDIATE`); another's
/// `begin` waits (`busy_timeout`) rather than failing with "database is
/// locked", and goes on once the first commits.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_waits_for_another_writer_instead_of_failing() {
    let (db, mut first) = migrated("busy").await;
    let mut second = sqlite::connect(&db.url()).await.unwrap();
    begin_top_level(&mut first).await.unwrap();
    sqlite::record(&mut first, &TestEvent::new("first"))
        .await
        .unwrap();
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        begin_top_level(&mut second).await.unwrap();
        let got_lock = started.elapsed();
        sqlite::record(&mut second, &TestEvent::new("second"))
            .await
            .unwrap();
        commit_top_level(&mut second).await.unwrap();
        got_lock
    });
    let hold = Duration::from_millis(700);
    tokio::time::sleep(hold).await;
    assert!(!waiting.is_finished(), "the second writer did not wait");
    commit_top_level(&mut first).await.unwrap();
    let got_lock = waiting.await.unwrap();
    assert!(got_lock >= hold, "got the lock after {got_lock:?}");
    assert!(got_lock < sqlite::BUSY_TIMEOUT, "waited {got_lock:?}");
    let aggregates: Vec<String> = stored(&mut first)
        .await
        .into_iter()
        .map(|r| r.aggregate_id)
        .collect();
    assert_eq!(aggregates, ["first", "second"]);
}

/// A writer that waits longer than `busy_timeout` fails, and holds nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_gives_up_after_the_busy_timeout() {
    let (db, mut first) = migrated("busytimeout").await;
    let mut second = sqlite::connect(&db.url()).await.unwrap();
    second
        .batch_execute("PRAGMA busy_timeout = 200")
        .await
        .unwrap();
    begin_top_level(&mut first).await.unwrap();
    let error = begin_top_level(&mut second).await.unwrap_err();
    assert!(error.to_string().contains("locked"), "{error}");
    assert!(!outbox_diesel::in_top_level_transaction(&mut second));
    commit_top_level(&mut first).await.unwrap();
    begin_top_level(&mut second).await.unwrap();
    commit_top_level(&mut second).await.unwrap();
}

/// A `SqliteTransaction` that SQLite rolled back is refused at commit and
/// its connection closed; the pool goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_sqlite_transaction_is_refused_and_its_connection_closed() {
    let (db, mut conn) = migrated("losttx").await;
    roll_back_by_trigger_setup(&mut conn).await;
    let pool = sqlite::pool(&db.url(), 1).unwrap();
    let mut tx = SqliteTransaction::begin(&pool).await.unwrap();
    sqlite::record(&mut tx, &TestEvent::new("lost"))
        .await
        .unwrap();
    roll_back_by_trigger(&mut tx).await;
    let error = tx.commit().await.unwrap_err();
    assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
    let mut tx = SqliteTransaction::begin(&pool).await.unwrap();
    sqlite::record(&mut tx, &TestEvent::new("next"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let aggregates: Vec<String> = stored(&mut conn)
        .await
        .into_iter()
        .map(|r| r.aggregate_id)
        .collect();
    assert_eq!(aggregates, ["next"]);
}

/// Recording works in transactions the application begins itself
/// (diesel-async's `immediate_transaction`), and in nested ones: a nested
/// transaction rolled back takes its events with it.
#[tokio::test(flavor = "multi_thread")]
async fn recording_in_the_applications_own_and_nested_transactions() {
    use diesel_async::AsyncConnection as _;
    let (_db, mut conn) = migrated("own").await;
    conn.immediate_transaction(async |conn| {
        sqlite::record(conn, &TestEvent::new("outer")).await?;
        let nested: Result<(), Error> = conn
            .transaction(async |conn| {
                sqlite::record(conn, &TestEvent::new("nested")).await?;
                Err(Error::Config("the handler failed".into()))
            })
            .await;
        assert!(nested.is_err());
        sqlite::record_all(
            conn,
            &[TestEvent::new("after-1"), TestEvent::new("after-2")],
        )
        .await?;
        Ok::<_, Error>(())
    })
    .await
    .unwrap();
    let aggregates: Vec<String> = stored(&mut conn)
        .await
        .into_iter()
        .map(|r| r.aggregate_id)
        .collect();
    assert_eq!(aggregates, ["outer", "after-1", "after-2"]);
}

/// After SQLite rolled the transaction back, a nested `transaction(..)`
/// sends a `SAVEPOINT`, which in autocommit starts a NEW transaction: a
/// `BEGIN` probe would take it for the old one, and its `RELEASE` would
/// commit an event on its own. The marker of `begin_top_level` went with
/// the rollback: recording and the inbox refuse, and nothing is stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_savepoint_after_a_rollback_does_not_let_an_event_commit_alone() {
    use diesel_async::AsyncConnection as _;
    let (_db, mut conn) = migrated("savepoint").await;
    roll_back_by_trigger_setup(&mut conn).await;
    begin_top_level(&mut conn).await.unwrap();
    roll_back_by_trigger(&mut conn).await;
    let recorded: Result<(), Error> = conn
        .transaction(async |conn| {
            sqlite::record(conn, &TestEvent::new("alone")).await?;
            Ok(())
        })
        .await;
    let error = recorded.unwrap_err();
    assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
    let received: Result<outbox_core::InboxOutcome, Error> = conn
        .transaction(async |conn| {
            outbox_core::InboxStore::receive(
                &sqlite::SqliteInbox::default(),
                conn,
                "billing",
                uuid::Uuid::now_v7(),
            )
            .await
        })
        .await;
    assert!(
        matches!(received, Err(Error::NotCommitted { .. })),
        "{received:?}"
    );
    commit_top_level(&mut conn).await.unwrap_err();
    let mut fresh = sqlite::connect(&_db.url()).await.unwrap();
    assert!(
        stored(&mut fresh).await.is_empty(),
        "no event committed alone"
    );
    assert_eq!(
        count(&mut fresh, "SELECT count(*) AS n FROM inbox_events").await,
        0
    );
}

/// A `begin` cancelled while it waits for the write lock closes its
/// connection: the lock is not kept by an idle pooled connection.
#[tokio::test(flavor = "multi_thread")]
async fn a_begin_cancelled_while_waiting_does_not_keep_the_write_lock() {
    let (db, _conn) = migrated("cancelbegin").await;
    let pool = sqlite::pool(&db.url(), 3).unwrap();
    let holder = SqliteTransaction::begin(&pool).await.unwrap();
    let waiting =
        tokio::time::timeout(Duration::from_millis(300), SqliteTransaction::begin(&pool)).await;
    assert!(waiting.is_err(), "the second begin waited for the lock");
    holder.commit().await.unwrap();
    let started = Instant::now();
    let mut third = SqliteTransaction::begin(&pool).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the write lock was kept for {:?}",
        started.elapsed()
    );
    sqlite::record(&mut third, &TestEvent::new("after"))
        .await
        .unwrap();
    third.commit().await.unwrap();
}

/// The wrapper's cancellation needs the multi-thread runtime: refused
/// clearly on the current-thread one instead of panicking later.
#[tokio::test(flavor = "current_thread")]
async fn the_current_thread_runtime_is_refused() {
    let (db, _) = (super::TempDb::new("flavor"), ());
    let Err(error) = sqlite::connect(&db.url()).await else {
        panic!("connected on the current-thread runtime");
    };
    assert!(
        matches!(&error, Error::Config(m) if m.contains("multi-thread")),
        "{error}"
    );
    assert!(matches!(sqlite::pool(&db.url(), 1), Err(Error::Config(_))));
}

/// A transaction begun by `begin_top_level` carries a marker that only the
/// checked commit removes: a plain `COMMIT` (diesel's own) is refused, so no
/// marker is left on the connection to vouch for a later transaction that
/// SQLite rolls back (which would let an event commit on its own).
#[tokio::test(flavor = "multi_thread")]
async fn a_marked_transaction_cannot_be_committed_behind_the_checks_back() {
    let (_db, mut conn) = migrated("stalemarker").await;
    roll_back_by_trigger_setup(&mut conn).await;
    begin_top_level(&mut conn).await.unwrap();
    sqlite::record(&mut conn, &TestEvent::new("first"))
        .await
        .unwrap();
    let error = Manager::commit_transaction(&mut conn).await.unwrap_err();
    assert!(error.to_string().contains("FOREIGN KEY"), "{error}");
    // diesel rolls back after a failed COMMIT (if it did not, closing the
    // connection would): nothing stored, no marker left.
    let _ = Manager::rollback_transaction(&mut conn).await;
    assert!(stored(&mut conn).await.is_empty());

    // The application's own transaction on the same connection, rolled
    // back by SQLite and carried on: recording refuses.
    let recorded: Result<(), Error> = conn
        .immediate_transaction(async |conn| {
            roll_back_by_trigger(conn).await;
            sqlite::record(conn, &TestEvent::new("alone")).await?;
            Ok(())
        })
        .await;
    assert!(recorded.is_err());
    assert!(
        stored(&mut conn).await.is_empty(),
        "no event committed alone"
    );
}
