//! Recording in the caller's MariaDB transaction: refused outside one (and
//! after the server rolled it back), byte-exact payloads, aggregate keys
//! compared byte for byte, the longest aggregate id, order kept.

use diesel_async::{AnsiTransactionManager, AsyncMysqlConnection, TransactionManager};
use outbox_core::EventEnvelope;
use outbox_core::testing::TestEvent;
use outbox_diesel::Error;
use outbox_diesel::mysql::{self, MysqlOutbox, MysqlSettings};
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names::unique;
use outbox_testkit::urls::mysql_url;

use super::{count, migrated, stored};

async fn begin(conn: &mut AsyncMysqlConnection) {
    outbox_diesel::begin_top_level(conn).await.unwrap();
}

#[tokio::test]
async fn recording_outside_a_transaction_is_refused_and_stores_nothing() {
    let (_db, mut conn) = migrated("notx").await;
    let error = mysql::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NoTransaction), "{error}");
    assert!(stored(&mut conn).await.is_empty());
}

#[tokio::test]
async fn recorded_events_commit_with_the_transaction_in_order() {
    let (_db, mut conn) = migrated("commit").await;
    begin(&mut conn).await;
    let one = mysql::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap();
    let many = mysql::record_all(
        &mut conn,
        &[
            TestEvent::new("o-2"),
            TestEvent::new("o-3"),
            TestEvent::new("o-4"),
        ],
    )
    .await
    .unwrap();
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    let rows = stored(&mut conn).await;
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let expected: Vec<String> = std::iter::once(one)
        .chain(many)
        .map(|id| id.to_string())
        .collect();
    assert_eq!(ids, expected, "stored in the order recorded");
    let aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(aggregates, ["o-1", "o-2", "o-3", "o-4"]);
}

#[tokio::test]
async fn a_rolled_back_transaction_records_nothing() {
    let (_db, mut conn) = migrated("rollback").await;
    begin(&mut conn).await;
    mysql::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap();
    AnsiTransactionManager::rollback_transaction(&mut conn)
        .await
        .unwrap();
    assert!(stored(&mut conn).await.is_empty());
}

/// The payload comes back byte for byte: MySQL's `JSON` type would
/// re-serialize it (spacing, key order, number forms).
#[tokio::test]
async fn payload_bytes_are_kept_exactly() {
    let (_db, mut conn) = migrated("bytes").await;
    let payloads = [
        r#"{"b": 1,   "a": [1.50, 1e3, -0.0], "dup": 1, "dup": 2}"#.to_owned(),
        r#"{"text":"é \u00e9 \ud83d\ude00 😀 \u0000 \" \\ /","big":123456789012345678901234567890}"#
            .to_owned(),
        format!("{}1{}", "[".repeat(100), "]".repeat(100)),
        format!(r#"{{"pad":"{}"}}"#, "x".repeat(1 << 20)),
    ];
    begin(&mut conn).await;
    let envelopes: Vec<EventEnvelope> =
        payloads.iter().map(|payload| raw("o-1", payload)).collect();
    // Together (one multi-row INSERT), then one by one (the prepared
    // one-row INSERT).
    let outbox = MysqlOutbox::default();
    outbox
        .record_envelopes(&mut conn, &envelopes)
        .await
        .unwrap();
    for envelope in &envelopes {
        let mut one = envelope.clone();
        one.id = uuid::Uuid::now_v7();
        outbox.record_envelopes(&mut conn, &[one]).await.unwrap();
    }
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    let rows = stored(&mut conn).await;
    assert_eq!(rows.len(), 2 * payloads.len());
    for (i, row) in rows.iter().enumerate() {
        let expected = &payloads[i % payloads.len()];
        // Compared without printing a mebibyte when they differ.
        assert!(
            row.payload == *expected,
            "payload {i} changed: {} bytes stored, {} recorded, starting {:?}",
            row.payload.len(),
            expected.len(),
            &row.payload[..row.payload.len().min(40)]
        );
    }
}

#[tokio::test]
async fn a_payload_that_is_not_json_is_refused_and_nothing_is_recorded() {
    let (_db, mut conn) = migrated("notjson").await;
    begin(&mut conn).await;
    let envelopes = [raw("o-1", "{}"), raw("o-2", "{\"a\": ")];
    let error = MysqlOutbox::default()
        .record_envelopes(&mut conn, &envelopes)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not JSON"), "{error}");
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    assert!(stored(&mut conn).await.is_empty());
}

/// `"A"`, `"a"` and `"a "` are three aggregates (the default collations
/// would fold case and trailing spaces); the longest id the envelope
/// allows (2,048 bytes, of 4-byte characters too) is stored whole.
#[tokio::test]
async fn aggregate_ids_are_compared_byte_for_byte_and_may_be_long() {
    let (_db, mut conn) = migrated("keys").await;
    let long = "😀".repeat(EventEnvelope::MAX_AGGREGATE_ID_BYTES / 4);
    assert_eq!(long.len(), EventEnvelope::MAX_AGGREGATE_ID_BYTES);
    let ids = ["A", "a", "a ", long.as_str()];
    begin(&mut conn).await;
    for id in ids {
        mysql::record(&mut conn, &TestEvent::new(id)).await.unwrap();
    }
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(DISTINCT aggregate_key) AS n FROM outbox_events"
        )
        .await,
        4
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE aggregate_id = 'a'"
        )
        .await,
        1,
        "'a' matches only itself"
    );
    let rows = stored(&mut conn).await;
    assert_eq!(rows[3].aggregate_id, long);
}

#[tokio::test]
async fn settings_name_the_database_recorded_into() {
    let home = TestMysqlDatabase::create(&mysql_url(), unique("my", "rhome")).await;
    let other = TestMysqlDatabase::create(&mysql_url(), unique("my", "rother")).await;
    let mut conn = mysql::connect(home.url()).await.unwrap();
    let settings = MysqlSettings::new(other.name()).unwrap();
    settings.migrate(&mut conn).await.unwrap();
    begin(&mut conn).await;
    settings
        .outbox()
        .record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap();
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    let mut in_other = mysql::connect(other.url()).await.unwrap();
    assert_eq!(stored(&mut in_other).await.len(), 1);
}

fn raw(aggregate_id: &str, payload: &str) -> EventEnvelope {
    let mut envelope = EventEnvelope::from_event(&TestEvent::new(aggregate_id)).unwrap();
    envelope.payload = payload.to_owned();
    envelope
}

/// More events than one prepared statement can bind (9 placeholders each,
/// 65,535 at most) are recorded in chunks, all or nothing.
#[tokio::test]
async fn thousands_of_events_are_recorded_in_chunks() {
    let (_db, mut conn) = migrated("chunks").await;
    let events: Vec<TestEvent> = (0..8_000)
        .map(|i| TestEvent::new(format!("o-{i}")))
        .collect();
    begin(&mut conn).await;
    let ids = mysql::record_all(&mut conn, &events).await.unwrap();
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    assert_eq!(ids.len(), 8_000);
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_events").await,
        8_000
    );

    // One invalid event among them: nothing of the call is inserted.
    let mut envelopes: Vec<EventEnvelope> =
        (0..2_500).map(|i| raw(&format!("p-{i}"), "{}")).collect();
    envelopes[2_400].payload = "not json".into();
    begin(&mut conn).await;
    MysqlOutbox::default()
        .record_envelopes(&mut conn, &envelopes)
        .await
        .unwrap_err();
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_events").await,
        8_000
    );
}

/// Connections run in strict SQL mode: a value too long for its column is
/// an error, never a silent truncation (which would merge two consumers).
#[tokio::test]
async fn values_too_long_are_refused_not_truncated() {
    let (_db, mut conn) = migrated("strict").await;
    begin(&mut conn).await;
    let consumer = "c".repeat(256);
    let error = outbox_core::InboxStore::receive(
        &outbox_diesel::mysql::MysqlInbox::default(),
        &mut conn,
        &consumer,
        uuid::Uuid::now_v7(),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("too long"), "{error}");
}
