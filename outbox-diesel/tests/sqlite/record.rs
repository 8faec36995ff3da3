//! Recording in the caller's SQLite transaction: refused outside one (and
//! after SQLite rolled it back), byte-exact payloads, aggregate keys
//! compared byte for byte, the longest aggregate id, order kept.

use diesel_async::TransactionManager;
use diesel_async::sync_connection_wrapper::SyncTransactionManagerWrapper;
use outbox_core::EventEnvelope;
use outbox_core::testing::TestEvent;
use outbox_diesel::Error;
use outbox_diesel::sqlite::{self, AsyncSqliteConnection, SqliteOutbox, SqliteSettings};

use super::{count, migrated, stored};

type Manager = SyncTransactionManagerWrapper<diesel::connection::AnsiTransactionManager>;

async fn begin(conn: &mut AsyncSqliteConnection) {
    outbox_diesel::begin_top_level(conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn recording_outside_a_transaction_is_refused_and_stores_nothing() {
    let (_db, mut conn) = migrated("notx").await;
    let error = sqlite::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NoTransaction), "{error}");
    let error = sqlite::record_all(&mut conn, &[TestEvent::new("o-1"), TestEvent::new("o-2")])
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NoTransaction), "{error}");
    assert!(stored(&mut conn).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn recorded_events_commit_with_the_transaction_in_order() {
    let (_db, mut conn) = migrated("commit").await;
    begin(&mut conn).await;
    let one = sqlite::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap();
    let many = sqlite::record_all(
        &mut conn,
        &[
            TestEvent::new("o-2"),
            TestEvent::new("o-3"),
            TestEvent::new("o-4"),
        ],
    )
    .await
    .unwrap();
    let last = SqliteSettings::default()
        .prepared_statements(false)
        .outbox()
        .record(&mut conn, &TestEvent::new("o-5"))
        .await
        .unwrap();
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    let rows = stored(&mut conn).await;
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let expected: Vec<String> = std::iter::once(one)
        .chain(many)
        .chain(std::iter::once(last))
        .map(|id| id.to_string())
        .collect();
    assert_eq!(ids, expected, "stored in the order recorded");
    let aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(aggregates, ["o-1", "o-2", "o-3", "o-4", "o-5"]);
    assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq));
}

/// Times are stored as microseconds; versions and headers as given.
#[tokio::test(flavor = "multi_thread")]
async fn columns_are_stored_as_the_schema_says() {
    let (_db, mut conn) = migrated("columns").await;
    let mut envelope = EventEnvelope::from_event(&TestEvent::new("o-1")).unwrap();
    envelope.aggregate_version = Some(i64::MAX);
    envelope.headers.insert("traceparent", "t\"1");
    let mut second = envelope.clone();
    second.id = uuid::Uuid::now_v7();
    second.aggregate_version = None;
    begin(&mut conn).await;
    let outbox = SqliteOutbox::default();
    outbox
        .record_envelopes(&mut conn, std::slice::from_ref(&envelope))
        .await
        .unwrap();
    outbox
        .record_envelopes(
            &mut conn,
            &[second.clone(), second.clone()].map(|mut e| {
                e.id = uuid::Uuid::now_v7();
                e
            }),
        )
        .await
        .unwrap();
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    let micros = envelope.occurred_at.timestamp_micros();
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) AS n FROM outbox_events WHERE occurred_at = {micros} \
                 AND typeof(occurred_at) = 'integer' AND status = 'pending' \
                 AND headers ->> '$.traceparent' = 't\"1'"
            )
        )
        .await,
        3
    );
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) AS n FROM outbox_events WHERE aggregate_version = {}",
                i64::MAX
            )
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox_events WHERE aggregate_version IS NULL"
        )
        .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolled_back_transaction_records_nothing() {
    let (_db, mut conn) = migrated("rollback").await;
    begin(&mut conn).await;
    sqlite::record(&mut conn, &TestEvent::new("o-1"))
        .await
        .unwrap();
    sqlite::record_all(&mut conn, &[TestEvent::new("o-2"), TestEvent::new("o-3")])
        .await
        .unwrap();
    Manager::rollback_transaction(&mut conn).await.unwrap();
    assert!(stored(&mut conn).await.is_empty());
}

/// The payload comes back byte for byte, through the one-row `INSERT` and
/// through the JSON array of the many-row one.
#[tokio::test(flavor = "multi_thread")]
async fn payload_bytes_are_kept_exactly() {
    let (_db, mut conn) = migrated("bytes").await;
    let payloads = [
        r#"{"b": 1,   "a": [1.50, 1e3, -0.0], "dup": 1, "dup": 2}"#.to_owned(),
        r#"{"text":"é \u00e9 \ud83d\ude00 😀 \u0000 \" \\ / \u2028 {}","big":123456789012345678901234567890}"#
            .replace("{}", "\u{202e}"),
        r#"["\ud800", 1E-400, 1e400]"#.to_owned(),
        "\t\n {\"sql\": \"'); DROP TABLE outbox_events; --\"} \r\n".to_owned(),
        format!("{}1{}", "[".repeat(1000), "]".repeat(1000)),
        format!(r#"{{"pad":"{}"}}"#, "x".repeat(1 << 20)),
    ];
    begin(&mut conn).await;
    let envelopes: Vec<EventEnvelope> =
        payloads.iter().map(|payload| raw("o-1", payload)).collect();
    // Together (the JSON array), then one by one (the one-row INSERT).
    let outbox = SqliteOutbox::default();
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

/// Not JSON, or nested deeper than SQLite's `json_valid` takes (1,000
/// levels): refused as an invalid event; the statement stores nothing and
/// the transaction goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_payload_that_is_not_json_is_refused_and_nothing_is_recorded() {
    let (_db, mut conn) = migrated("notjson").await;
    begin(&mut conn).await;
    let deep = format!("{}1{}", "[".repeat(1001), "]".repeat(1001));
    for envelopes in [
        vec![raw("o-1", "{}"), raw("o-2", "{\"a\": ")],
        vec![raw("o-3", "")],
        vec![raw("o-4", "{'a': 1}")],
        vec![raw("o-5", &deep)],
        vec![raw("o-6", "{}"), raw("o-7", &deep)],
    ] {
        let error = SqliteOutbox::default()
            .record_envelopes(&mut conn, &envelopes)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, Error::Event(_)) && error.to_string().contains("not JSON"),
            "{error}"
        );
    }
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    assert!(stored(&mut conn).await.is_empty());
}

/// `"A"`, `"a"` and `"a "` are three aggregates; the longest id the
/// envelope allows (2,048 bytes, of 4-byte characters too) is stored whole.
#[tokio::test(flavor = "multi_thread")]
async fn aggregate_ids_are_compared_byte_for_byte_and_may_be_long() {
    let (_db, mut conn) = migrated("keys").await;
    let long = "😀".repeat(EventEnvelope::MAX_AGGREGATE_ID_BYTES / 4);
    assert_eq!(long.len(), EventEnvelope::MAX_AGGREGATE_ID_BYTES);
    let ids = ["A", "a", "a ", long.as_str()];
    begin(&mut conn).await;
    for id in ids {
        sqlite::record(&mut conn, &TestEvent::new(id))
            .await
            .unwrap();
    }
    sqlite::record_all(&mut conn, &[TestEvent::new(&long), TestEvent::new("a")])
        .await
        .unwrap();
    outbox_diesel::commit_top_level(&mut conn).await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(DISTINCT aggregate_id) AS n FROM outbox_events"
        )
        .await,
        4
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox_events WHERE aggregate_id = 'a'"
        )
        .await,
        2,
        "'a' matches only itself"
    );
    let rows = stored(&mut conn).await;
    assert_eq!(rows[3].aggregate_id, long);
    assert_eq!(rows[4].aggregate_id, long);
}

/// SQLite rolls the whole transaction back on some errors (here
/// `RAISE(ROLLBACK)` in a trigger) and runs what follows in autocommit:
/// the recorder then refuses, so no event commits on its own.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_recorded_after_sqlite_rolled_the_transaction_back() {
    let (_db, mut conn) = migrated("lost").await;
    super::commit::roll_back_by_trigger_setup(&mut conn).await;
    begin(&mut conn).await;
    sqlite::record(&mut conn, &TestEvent::new("before"))
        .await
        .unwrap();
    super::commit::roll_back_by_trigger(&mut conn).await;
    for result in [
        sqlite::record(&mut conn, &TestEvent::new("o-1"))
            .await
            .map(|_| ()),
        sqlite::record_all(&mut conn, &[TestEvent::new("o-2"), TestEvent::new("o-3")])
            .await
            .map(|_| ()),
    ] {
        let error = result.unwrap_err();
        assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
    }
    let error = outbox_diesel::commit_top_level(&mut conn)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NotCommitted { .. }), "{error}");
    assert!(stored(&mut conn).await.is_empty(), "nothing autocommitted");
}

fn raw(aggregate_id: &str, payload: &str) -> EventEnvelope {
    let mut envelope = EventEnvelope::from_event(&TestEvent::new(aggregate_id)).unwrap();
    envelope.payload = payload.to_owned();
    envelope
}
