//! The inbox deduplicates per consumer inside the consumer's transaction:
//! first time once, duplicates after commit, nothing kept on rollback, and
//! old entries purge in bounded chunks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use chrono::Utc;
use common::TestDb;
use diesel_async::{AsyncConnection as _, AsyncPgConnection};
use outbox_core::{InboxOutcome, InboxStore as _};
use outbox_diesel::{Error, PgInbox};
use uuid::Uuid;

/// `receive` in its own committed transaction.
async fn receive_committed(
    inbox: &PgInbox,
    conn: &mut AsyncPgConnection,
    consumer: &str,
    event_id: Uuid,
) -> InboxOutcome {
    conn.transaction::<_, Error, _>(async |conn| inbox.receive(conn, consumer, event_id).await)
        .await
        .unwrap()
}

#[tokio::test]
async fn same_event_twice_is_first_time_then_duplicate() {
    let db = TestDb::new("inbox_dup").await;
    let inbox = PgInbox::new(&db.schema).unwrap();
    let mut conn = db.conn().await;
    let id = Uuid::now_v7();

    let first = receive_committed(&inbox, &mut conn, "loyalty", id).await;
    assert_eq!(first, InboxOutcome::FirstTime);
    // A redelivery, in a later transaction (here even on another connection).
    let mut other = db.conn().await;
    let second = receive_committed(&inbox, &mut other, "loyalty", id).await;
    assert_eq!(second, InboxOutcome::Duplicate);
    let third = receive_committed(&inbox, &mut conn, "loyalty", id).await;
    assert_eq!(third, InboxOutcome::Duplicate);
    assert_eq!(db.count("inbox_events", ""), 1);

    // Within one transaction the second receive is a duplicate too.
    let other_id = Uuid::now_v7();
    let outcomes = conn
        .transaction::<_, Error, _>(async |conn| {
            let a = inbox.receive(conn, "loyalty", other_id).await?;
            let b = inbox.receive(conn, "loyalty", other_id).await?;
            Ok((a, b))
        })
        .await
        .unwrap();
    assert_eq!(outcomes, (InboxOutcome::FirstTime, InboxOutcome::Duplicate));
    assert_eq!(db.count("inbox_events", ""), 2);
}

#[tokio::test]
async fn each_consumer_sees_an_event_for_the_first_time() {
    let db = TestDb::new("inbox_consumers").await;
    let inbox = PgInbox::new(&db.schema).unwrap();
    let mut conn = db.conn().await;
    let id = Uuid::now_v7();

    assert_eq!(
        receive_committed(&inbox, &mut conn, "loyalty", id).await,
        InboxOutcome::FirstTime
    );
    assert_eq!(
        receive_committed(&inbox, &mut conn, "shipping", id).await,
        InboxOutcome::FirstTime
    );
    assert_eq!(
        receive_committed(&inbox, &mut conn, "shipping", id).await,
        InboxOutcome::Duplicate
    );
    assert_eq!(
        db.count(
            "inbox_events",
            &format!("WHERE event_id = '{id}' AND consumer IN ('loyalty', 'shipping')")
        ),
        2
    );
}

#[tokio::test]
async fn rolled_back_handler_leaves_the_event_first_time_on_redelivery() {
    let db = TestDb::new("inbox_rollback").await;
    let inbox = PgInbox::new(&db.schema).unwrap();
    let mut conn = db.conn().await;
    let id = Uuid::now_v7();

    let result = conn
        .transaction::<(), Error, _>(async |conn| {
            let outcome = inbox.receive(conn, "loyalty", id).await?;
            assert_eq!(outcome, InboxOutcome::FirstTime);
            // The handler fails after the inbox entry was written.
            Err(Error::Database(diesel::result::Error::RollbackTransaction))
        })
        .await;
    assert!(result.is_err());
    assert_eq!(db.count("inbox_events", ""), 0, "the entry rolled back");

    assert_eq!(
        receive_committed(&inbox, &mut conn, "loyalty", id).await,
        InboxOutcome::FirstTime,
        "a redelivery after a rollback must run the handler"
    );
    assert_eq!(
        receive_committed(&inbox, &mut conn, "loyalty", id).await,
        InboxOutcome::Duplicate
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_redelivery_waits_for_the_first_handler_and_is_a_duplicate() {
    let db = TestDb::new("inbox_race").await;
    let inbox = PgInbox::new(&db.schema).unwrap();
    let mut first = db.conn().await;
    let id = Uuid::now_v7();
    let url = db.url.clone();
    let schema = db.schema.clone();

    let outcome = first
        .transaction::<_, Error, _>(async |conn| {
            let outcome = inbox.receive(conn, "loyalty", id).await?;
            // A second instance of the consumer gets the same message now.
            let second = {
                let inbox = inbox.clone();
                let mut conn = outbox_diesel::connect(&url).await.unwrap();
                tokio::spawn(async move {
                    conn.transaction::<_, Error, _>(async |conn| {
                        inbox.receive(conn, "loyalty", id).await
                    })
                    .await
                })
            };
            // It must wait on our uncommitted entry, not decide on its own.
            wait_for_lock_waiter(&db, &schema).await;
            assert!(!second.is_finished());
            Ok((outcome, second))
        })
        .await
        .unwrap();
    let (outcome, second) = outcome;
    assert_eq!(outcome, InboxOutcome::FirstTime);
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second receive finishes once the first commits")
        .unwrap()
        .unwrap();
    assert_eq!(second, InboxOutcome::Duplicate);
    assert_eq!(db.count("inbox_events", ""), 1);
}

/// Waits until some session is blocked on a lock while inserting into this
/// schema's inbox.
async fn wait_for_lock_waiter(db: &TestDb, schema: &str) {
    let sql = format!(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND pid <> pg_backend_pid() AND query LIKE '%\"{schema}\".inbox_events%'"
    );
    let mut conn = db.sync_conn();
    outbox_testkit::eventually::eventually("the second receive waits on the first one's entry")
        .every(Duration::from_millis(10))
        .until(|| std::future::ready(outbox_testkit::pg::count_sync(&mut conn, &sql) > 0))
        .await;
}

#[tokio::test]
async fn receive_outside_a_transaction_is_an_error_and_writes_nothing() {
    let db = TestDb::new("inbox_no_tx").await;
    let inbox = PgInbox::new(&db.schema).unwrap();
    let mut conn = db.conn().await;
    let err = inbox
        .receive(&mut conn, "loyalty", Uuid::now_v7())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoTransaction), "{err:?}");
    assert_eq!(db.count("inbox_events", ""), 0);
}

#[tokio::test]
async fn purge_deletes_only_old_entries_in_chunks() {
    let db = TestDb::new("inbox_purge").await;
    let inbox = PgInbox::new(&db.schema).unwrap();
    let mut conn = db.conn().await;
    let old: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    let recent: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    for id in old.iter().chain(&recent) {
        assert_eq!(
            receive_committed(&inbox, &mut conn, "loyalty", *id).await,
            InboxOutcome::FirstTime
        );
    }
    let old_list = old
        .iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(", ");
    db.execute(&format!(
        "UPDATE {{schema}}.inbox_events SET received_at = now() - interval '2 days' \
         WHERE event_id IN ({old_list})"
    ));

    let before = Utc::now() - chrono::Duration::days(1);
    assert_eq!(inbox.purge(&mut conn, before, 2).await.unwrap(), 2);
    assert_eq!(db.count("inbox_events", ""), 6);
    assert_eq!(inbox.purge(&mut conn, before, 2).await.unwrap(), 2);
    assert_eq!(
        inbox.purge(&mut conn, before, 2).await.unwrap(),
        1,
        "a short chunk: drained"
    );
    assert_eq!(inbox.purge(&mut conn, before, 2).await.unwrap(), 0);

    assert_eq!(db.count("inbox_events", ""), 3);
    assert_eq!(
        db.count("inbox_events", &format!("WHERE event_id IN ({old_list})")),
        0,
        "every old entry is gone"
    );
    // The recent entries still deduplicate.
    for id in &recent {
        assert_eq!(
            receive_committed(&inbox, &mut conn, "loyalty", *id).await,
            InboxOutcome::Duplicate
        );
    }
}

#[tokio::test]
async fn receive_all_records_several_entries_in_one_statement() {
    use outbox_core::InboxDatabase;
    use outbox_diesel::PgInboxDatabase;

    let db = TestDb::new("inbox_all").await;
    let database = PgInboxDatabase::new(db.pool.clone(), PgInbox::new(&db.schema).unwrap());
    let known = Uuid::now_v7();
    let mut tx = database.begin().await.unwrap();
    database.receive(&mut tx, "loyalty", known).await.unwrap();
    database.commit(tx).await.unwrap();

    let (new, twice) = (Uuid::now_v7(), Uuid::now_v7());
    let ids = [new, known, twice, twice];
    let mut tx = database.begin().await.unwrap();
    let outcomes = database
        .receive_all(&mut tx, "loyalty", &ids)
        .await
        .unwrap();
    use InboxOutcome::{Duplicate, FirstTime};
    assert_eq!(outcomes, [FirstTime, Duplicate, FirstTime, Duplicate]);
    // Rolled back: nothing kept, and first time again.
    database.rollback(tx).await.unwrap();
    assert_eq!(db.count("inbox_events", ""), 1);
    let mut tx = database.begin().await.unwrap();
    let outcomes = database
        .receive_all(&mut tx, "loyalty", &ids[..3])
        .await
        .unwrap();
    assert_eq!(outcomes, [FirstTime, Duplicate, FirstTime]);
    database.commit(tx).await.unwrap();
    assert_eq!(db.count("inbox_events", ""), 3);
    // Another consumer: all first time; none at all: nothing to do.
    let mut tx = database.begin().await.unwrap();
    let outcomes = database
        .receive_all(&mut tx, "shipping", &ids[..2])
        .await
        .unwrap();
    assert_eq!(outcomes, [FirstTime, FirstTime]);
    assert!(
        database
            .receive_all(&mut tx, "shipping", &[])
            .await
            .unwrap()
            .is_empty()
    );
    database.commit(tx).await.unwrap();
    assert_eq!(db.count("inbox_events", ""), 5);
}
