//! The inbox on MariaDB: first time, duplicate (also several ids at once,
//! as a batch consumer records them), refused outside a
//! transaction, rolled back with the handler's transaction, purged in
//! chunks; dead letters recorded.

use chrono::{Duration, Utc};
use diesel_async::AsyncMysqlConnection;
use outbox_core::admin::DeadLetter;
use outbox_core::{InboxDatabase, InboxOutcome, InboxStore};
use outbox_diesel::Error;
use outbox_diesel::mysql::{self, MysqlInbox, MysqlInboxDatabase};
use uuid::Uuid;

use super::{count, migrated};

async fn receive(conn: &mut AsyncMysqlConnection, consumer: &str, id: Uuid) -> InboxOutcome {
    MysqlInbox::default()
        .receive(conn, consumer, id)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_redelivery_is_a_duplicate_for_its_consumer_only() {
    let (_db, mut conn) = migrated("dup").await;
    let id = Uuid::now_v7();
    outbox_diesel::begin_top_level(&mut conn).await.unwrap();
    assert_eq!(
        receive(&mut conn, "billing", id).await,
        InboxOutcome::FirstTime
    );
    assert_eq!(
        receive(&mut conn, "billing", id).await,
        InboxOutcome::Duplicate
    );
    assert_eq!(
        receive(&mut conn, "Billing", id).await,
        InboxOutcome::FirstTime
    );
    assert_eq!(
        receive(&mut conn, "billing ", id).await,
        InboxOutcome::FirstTime
    );
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT COALESCE(SUM(duplicates), 0) AS n FROM inbox_events"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn receiving_outside_a_transaction_is_refused() {
    let (_db, mut conn) = migrated("inboxnotx").await;
    let error = MysqlInbox::default()
        .receive(&mut conn, "billing", Uuid::now_v7())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NoTransaction), "{error}");
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM inbox_events").await,
        0
    );
}

#[tokio::test]
async fn a_handler_rolled_back_leaves_the_event_to_handle_again() {
    let (db, _conn) = migrated("inboxdb").await;
    let database =
        MysqlInboxDatabase::new(mysql::pool(db.url(), 2).unwrap(), MysqlInbox::default());
    let id = Uuid::now_v7();
    let mut tx = database.begin().await.unwrap();
    assert_eq!(
        database.receive(&mut tx, "c", id).await.unwrap(),
        InboxOutcome::FirstTime
    );
    database.rollback(tx).await.unwrap();
    let mut tx = database.begin().await.unwrap();
    assert_eq!(
        database.receive(&mut tx, "c", id).await.unwrap(),
        InboxOutcome::FirstTime
    );
    database.commit(tx).await.unwrap();
    let mut tx = database.begin().await.unwrap();
    assert_eq!(
        database.receive(&mut tx, "c", id).await.unwrap(),
        InboxOutcome::Duplicate
    );
    drop(tx);
}

#[tokio::test]
async fn purge_deletes_old_entries_in_chunks() {
    let (_db, mut conn) = migrated("purge").await;
    outbox_diesel::begin_top_level(&mut conn).await.unwrap();
    for _ in 0..5 {
        receive(&mut conn, "c", Uuid::now_v7()).await;
    }
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    let inbox = MysqlInbox::default();
    let past = Utc::now() - Duration::hours(1);
    assert_eq!(
        inbox.purge(&mut conn, past, 10).await.unwrap(),
        0,
        "none that old"
    );
    let future = Utc::now() + Duration::hours(1);
    assert_eq!(inbox.purge(&mut conn, future, 2).await.unwrap(), 2);
    assert_eq!(inbox.purge(&mut conn, future, 2).await.unwrap(), 2);
    assert_eq!(inbox.purge(&mut conn, future, 2).await.unwrap(), 1);
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM inbox_events").await,
        0
    );
}

#[tokio::test]
async fn dead_letters_are_recorded() {
    let (db, mut conn) = migrated("letters").await;
    let database =
        MysqlInboxDatabase::new(mysql::pool(db.url(), 1).unwrap(), MysqlInbox::default());
    let mut letter = DeadLetter::new(
        "billing",
        "billing.q",
        "events",
        "order.placed",
        "handler failed",
        b"{\"a\":1}",
    );
    letter.event_id = Some(Uuid::now_v7());
    letter
        .headers
        .insert("x-outbox-dead-letter-id".into(), "dl-1".into());
    database.record_dead_letter(&letter).await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM inbox_dead_letters \
             WHERE dead_letter_id = 'dl-1' AND queue = 'billing.q' AND payload = '{\"a\":1}'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn receive_all_answers_each_id_in_one_transaction() {
    // The batch consumer's entries: the default `receive_all`, one insert
    // per id, in order.
    let (db, _conn) = migrated("inboxall").await;
    let database =
        MysqlInboxDatabase::new(mysql::pool(db.url(), 2).unwrap(), MysqlInbox::default());
    let (known, new, twice) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let mut tx = database.begin().await.unwrap();
    database.receive(&mut tx, "c", known).await.unwrap();
    database.commit(tx).await.unwrap();
    let mut tx = database.begin().await.unwrap();
    let outcomes = database
        .receive_all(&mut tx, "c", &[new, known, twice, twice])
        .await
        .unwrap();
    use InboxOutcome::{Duplicate, FirstTime};
    assert_eq!(outcomes, [FirstTime, Duplicate, FirstTime, Duplicate]);
    database.commit(tx).await.unwrap();
    let mut tx = database.begin().await.unwrap();
    let outcomes = database
        .receive_all(&mut tx, "c", &[new, twice])
        .await
        .unwrap();
    assert_eq!(outcomes, [Duplicate, Duplicate], "both committed");
    database.rollback(tx).await.unwrap();
}
