//! Recording inside the caller's transaction, async and sync.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::{TestDb, moved};
use diesel::Connection as _;
use diesel_async::AsyncConnection as _;
use outbox_core::{Claim as _, DomainEvent, EventEnvelope, EventStatus, Headers, OutboxStore};
use outbox_diesel::Error;
use serde::Serialize;

#[tokio::test]
async fn committed_event_is_stored_with_every_field() {
    let db = TestDb::new("record_commit").await;
    let mut conn = db.conn().await;
    let envelope = EventEnvelope::from_event(&moved("p-1", 3))
        .unwrap()
        .with_correlation_id("req-9")
        .with_causation_id("evt-1")
        .with_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    let expected = envelope.clone();
    conn.transaction::<_, Error, _>(async |conn| {
        db.outbox.record_envelopes(conn, &[envelope]).await
    })
    .await
    .unwrap();

    let claim = db
        .store()
        .claim(10)
        .await
        .unwrap()
        .expect("the event is claimable");
    let record = &claim.records()[0];
    assert_eq!(record.envelope.id, expected.id);
    assert_eq!(record.envelope.aggregate_type, "piece");
    assert_eq!(record.envelope.aggregate_id, "p-1");
    assert_eq!(record.envelope.aggregate_version, Some(3));
    assert_eq!(record.envelope.event_type, "piece.moved");
    assert_eq!(record.envelope.schema_version, 1);
    assert_eq!(record.envelope.payload, expected.payload);
    assert_eq!(record.envelope.headers, expected.headers);
    assert_eq!(
        record.envelope.headers.get(Headers::CORRELATION_ID),
        Some("req-9")
    );
    // PostgreSQL keeps microseconds.
    assert_eq!(
        record.envelope.occurred_at.timestamp_micros(),
        expected.occurred_at.timestamp_micros()
    );
    assert_eq!(record.status, EventStatus::Pending);
    assert_eq!(record.attempts, 0);
    assert_eq!(record.next_attempt_at, None);
    assert_eq!(record.last_error, None);
    assert_eq!(record.published_at, None);
    assert!(record.seq > 0);
}

#[tokio::test]
async fn payload_is_stored_byte_exact() {
    #[derive(Serialize)]
    struct Odd {
        id: String,
        // Key order, unicode and escapes must survive (jsonb would reorder).
        zeta: u8,
        alpha: String,
    }
    impl DomainEvent for Odd {
        fn aggregate_type(&self) -> &'static str {
            "odd"
        }
        fn event_type(&self) -> &'static str {
            "odd.happened"
        }
        fn aggregate_id(&self) -> String {
            self.id.clone()
        }
    }
    let db = TestDb::new("record_bytes").await;
    let mut conn = db.conn().await;
    let event = Odd {
        id: "it's \"quoted\"; DROP TABLE x; --".into(),
        zeta: 1,
        alpha: "ünïcödé \u{1F600} \\ \n \u{0}".into(),
    };
    let payload = serde_json::to_string(&event).unwrap();
    conn.transaction::<_, Error, _>(async |conn| db.outbox.record(conn, &event).await)
        .await
        .unwrap();
    let claim = db.store().claim(1).await.unwrap().unwrap();
    assert_eq!(claim.records()[0].envelope.payload, payload);
    assert_eq!(claim.records()[0].envelope.aggregate_id, event.id);
}

#[tokio::test]
async fn rolled_back_event_is_not_stored() {
    let db = TestDb::new("record_rollback").await;
    let mut conn = db.conn().await;
    let result = conn
        .transaction::<(), Error, _>(async |conn| {
            db.outbox.record(conn, &moved("p-1", 1)).await?;
            Err(Error::Database(diesel::result::Error::RollbackTransaction))
        })
        .await;
    assert!(result.is_err());
    assert_eq!(db.count("outbox_events", ""), 0);
    assert!(db.store().claim(10).await.unwrap().is_none());
}

#[tokio::test]
async fn recording_outside_a_transaction_is_an_error_and_writes_nothing() {
    let db = TestDb::new("record_no_tx").await;
    let mut conn = db.conn().await;
    let err = db
        .outbox
        .record(&mut conn, &moved("p-1", 1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoTransaction), "{err:?}");
    assert!(err.to_string().contains("transaction"), "{err}");
    let err = db
        .outbox
        .record_all(&mut conn, &[moved("p-1", 1)])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoTransaction), "{err:?}");
    assert_eq!(db.count("outbox_events", ""), 0);
}

#[tokio::test]
async fn unserializable_payload_fails_and_the_transaction_can_roll_back() {
    #[derive(Serialize)]
    struct Bad {
        map: HashMap<(u8, u8), u8>,
    }
    impl DomainEvent for Bad {
        fn aggregate_type(&self) -> &'static str {
            "bad"
        }
        fn event_type(&self) -> &'static str {
            "bad.event"
        }
        fn aggregate_id(&self) -> String {
            "1".into()
        }
    }
    let db = TestDb::new("record_bad").await;
    let mut conn = db.conn().await;
    let result = conn
        .transaction::<(), Error, _>(async |conn| {
            db.outbox.record(conn, &moved("before", 1)).await?;
            let err = db
                .outbox
                .record(
                    conn,
                    &Bad {
                        map: HashMap::from([((1, 2), 3)]),
                    },
                )
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::Event(outbox_core::Error::Serialize { .. })),
                "{err:?}"
            );
            // The transaction is still usable: the caller decides.
            db.outbox.record(conn, &moved("after", 1)).await?;
            Err(err)
        })
        .await;
    assert!(result.is_err());
    assert_eq!(db.count("outbox_events", ""), 0, "everything rolled back");
}

#[tokio::test]
async fn record_all_writes_every_event_in_order() {
    let db = TestDb::new("record_all").await;
    let mut conn = db.conn().await;
    let events: Vec<_> = (0..250).map(|n| moved(&format!("p{}", n % 7), n)).collect();
    let ids = conn
        .transaction::<_, Error, _>(async |conn| db.outbox.record_all(conn, &events).await)
        .await
        .unwrap();
    assert_eq!(ids.len(), 250);
    let store = db.store();
    store
        .set_delivery_order(outbox_core::DeliveryOrder::Unordered)
        .await
        .unwrap();
    let claim = store.claim(1000).await.unwrap().unwrap();
    let claimed: Vec<_> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(claimed, ids, "seq follows the order of the slice");
    let empty: Vec<outbox_core::testing::TestEvent> = Vec::new();
    let none = conn
        .transaction::<_, Error, _>(async |conn| db.outbox.record_all(conn, &empty).await)
        .await
        .unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn sync_connections_record_in_their_transaction() {
    let db = TestDb::new("record_sync").await;
    let mut conn = db.sync_conn();
    let id = conn
        .transaction::<_, Error, _>(|conn| db.outbox.record_sync(conn, &moved("s", 1)))
        .unwrap();
    let _ = conn.transaction::<(), Error, _>(|conn| {
        db.outbox
            .record_all_sync(conn, &[moved("s", 2), moved("s", 3)])?;
        Err(Error::Database(diesel::result::Error::RollbackTransaction))
    });
    let err = db
        .outbox
        .record_sync(&mut conn, &moved("s", 4))
        .unwrap_err();
    assert!(matches!(err, Error::NoTransaction), "{err:?}");
    assert_eq!(db.count("outbox_events", ""), 1);
    let claim = db.store().claim(10).await.unwrap().unwrap();
    assert_eq!(claim.records()[0].id(), id);
}

#[tokio::test]
async fn notify_is_sent_on_commit_only() {
    use diesel_async::RunQueryDsl;
    use futures_util::StreamExt;
    let db = TestDb::new("record_notify").await;
    let mut listener = db.conn().await;
    let channel = db.outbox.schema().quoted_channel();
    diesel::sql_query(format!("LISTEN {channel}"))
        .execute(&mut listener)
        .await
        .unwrap();
    let mut conn = db.conn().await;
    let _ = conn
        .transaction::<(), Error, _>(async |conn| {
            db.outbox.record(conn, &moved("n", 1)).await?;
            Err(Error::Database(diesel::result::Error::RollbackTransaction))
        })
        .await;
    conn.transaction::<_, Error, _>(async |conn| {
        db.outbox.record(conn, &moved("n", 2)).await?;
        db.outbox.record(conn, &moved("n", 3)).await
    })
    .await
    .unwrap();
    let mut stream = std::pin::pin!(listener.notifications_stream());
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), stream.next())
        .await
        .expect("a NOTIFY after commit")
        .unwrap()
        .unwrap();
    assert_eq!(first.channel, db.outbox.schema().channel());
    assert_eq!(first.payload, "");
    // Two records in one transaction fold into one notification, and the
    // rolled-back one sent none.
    let more = tokio::time::timeout(std::time::Duration::from_millis(300), stream.next()).await;
    assert!(more.is_err(), "only one notification: {more:?}");
}

#[tokio::test]
async fn pooled_connections_record_and_context_headers_are_attached() {
    let db = TestDb::new("record_pooled").await;
    let mut conn = db.pool.get().await.unwrap();
    let scoped = Headers::new().with(Headers::CORRELATION_ID, "req-42").with(
        Headers::TRACEPARENT,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let id = outbox_core::context::scope(scoped.clone(), async {
        conn.transaction::<_, Error, _>(async |conn| db.outbox.record(conn, &moved("p", 1)).await)
            .await
    })
    .await
    .unwrap();
    let claim = db.store().claim(1).await.unwrap().unwrap();
    assert_eq!(claim.records()[0].id(), id);
    assert_eq!(claim.records()[0].envelope.headers, scoped);
}
