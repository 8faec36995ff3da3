//! Consumers' dead letters on SQLite: `SqliteInboxDatabase` records them
//! (outside any handler transaction), `SqliteDeadLetters` lists them in
//! order by queue with pages, shows one, groups them by consumer, event
//! type and normalized reason, marks them replayed or purged, and writes
//! the audit rows of the verbs over them; the janitor deletes settled
//! records past the retention (`admin.rs`).

use outbox_core::InboxDatabase as _;
use outbox_core::admin::{
    AuditEntry, DeadLetter, DeadLetterQuery, DeadLetterStore as _, ReplayedMessage,
};
use outbox_diesel::sqlite::{self, SqliteDeadLetters, SqliteInboxDatabase, SqliteSettings};
use uuid::Uuid;

use super::{count, migrated};

fn letter(queue: &str, reason: &str, event_id: Option<Uuid>, body: &[u8]) -> DeadLetter {
    let mut letter = DeadLetter::new(
        "loyalty",
        queue,
        format!("{queue}.dlx"),
        "order.placed",
        reason,
        body,
    );
    letter.event_id = event_id;
    letter.message_id = event_id.map(|id| id.to_string());
    letter.event_type = event_id.map(|_| "order.placed".to_owned());
    letter.attempts = 3;
    letter
        .headers
        .insert("x-outbox-queue".into(), queue.to_owned());
    letter
        .headers
        .insert("x-outbox-dead-letter-id".into(), Uuid::now_v7().to_string());
    letter
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_recorded_listed_grouped_and_marked() {
    let (db, mut conn) = migrated("dead-letters").await;
    let pool = sqlite::pool(&db.url(), 2).unwrap();
    let settings = SqliteSettings::default();
    let database = SqliteInboxDatabase::new(pool.clone(), settings.inbox());
    let letters = settings.dead_letters(pool.clone());
    assert!(format!("{letters:?}").contains("SqliteDeadLetters"));
    let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());

    let recorded = [
        letter("orders", "stock for row 17 missing", Some(a), b"{\"n\":1}"),
        letter("orders", "stock for row 9 missing", Some(b), b"nul \0 here"),
        letter(
            "payments",
            "cannot decode the message: not JSON",
            None,
            b"\xff",
        ),
        letter("orders", "timeout", Some(c), b"{}"),
    ];
    for l in &recorded {
        database.record_dead_letter(l).await.unwrap();
    }
    let n = count(&mut conn, "SELECT count(*) AS n FROM inbox_dead_letters").await;
    assert_eq!(n, 4);

    // Everything, in recording order, as recorded.
    let all = letters
        .list(&DeadLetterQuery::new().limit(10))
        .await
        .unwrap();
    assert_eq!(all.next, None);
    assert_eq!(all.items.len(), 4);
    let first = &all.items[0];
    assert_eq!(first.letter.event_id, Some(a));
    assert_eq!(first.letter.message_id, Some(a.to_string()));
    assert_eq!(first.letter.event_type.as_deref(), Some("order.placed"));
    assert_eq!(first.letter.consumer, "loyalty");
    assert_eq!(first.letter.queue, "orders");
    assert_eq!(first.letter.exchange, "orders.dlx");
    assert_eq!(first.letter.routing_key, "order.placed");
    assert_eq!(first.letter.attempts, 3);
    assert_eq!(first.letter.reason, "stock for row 17 missing");
    assert_eq!(first.letter.payload, "{\"n\":1}");
    assert!(!first.letter.payload_truncated);
    assert_eq!(first.letter.headers, recorded[0].headers);
    assert_eq!(
        first.letter.dead_lettered_at.timestamp_micros(),
        recorded[0].dead_lettered_at.timestamp_micros()
    );
    assert!(first.is_open() && !first.redacted);
    assert_eq!(
        all.items[1].letter.payload, "nul \0 here",
        "SQLite text keeps a NUL"
    );
    assert_eq!(all.items[2].letter.event_id, None);
    assert_eq!(all.items[2].letter.payload, "\u{fffd}");
    let ids: Vec<i64> = all.items.iter().map(|r| r.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "id order: {ids:?}");

    // One queue, page by page.
    let page = letters
        .list(&DeadLetterQuery::new().queue("orders").limit(2))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.next, Some(page.items[1].id));
    let rest = letters
        .list(
            &DeadLetterQuery::new()
                .queue("orders")
                .after(page.next)
                .limit(2),
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.items[0].letter.event_id, Some(c));
    assert_eq!(rest.next, None);

    let shown = letters.show(ids[2]).await.unwrap().unwrap();
    assert_eq!(shown, all.items[2]);
    assert_eq!(letters.show(-1).await.unwrap(), None);

    // Groups: the two "row N missing" letters are one failure.
    let groups = letters.groups(None).await.unwrap();
    assert_eq!(groups.len(), 3);
    assert_eq!(groups[0].count, 2);
    assert_eq!(groups[0].reason, "stock for row <n> missing");
    assert_eq!(groups[0].consumer, "loyalty");
    assert_eq!(groups[0].event_type.as_deref(), Some("order.placed"));
    assert!(groups[0].first_seen <= groups[0].last_seen);
    assert_eq!(letters.groups(Some("payments")).await.unwrap().len(), 1);

    // By the id the consumer gave it: also an undecodable letter (no
    // event id), and only that record.
    let undecodable = Uuid::parse_str(&recorded[2].headers["x-outbox-dead-letter-id"]).unwrap();
    let by_letter = [ReplayedMessage::new("payments", None, Some(undecodable))];
    assert_eq!(letters.mark_replayed(&by_letter).await.unwrap(), 1);
    assert_eq!(letters.mark_replayed(&by_letter).await.unwrap(), 0, "once");
    assert!(!letters.show(ids[2]).await.unwrap().unwrap().is_open());

    // Messages without the consumer's id (dead-lettered by the broker, or
    // before consumers set it) mark one open record without an id of their
    // event in the queue they went back to, per message; never a record
    // with its own id (its message may still be in the queue).
    let by_event = |queue: &str, id: Uuid| ReplayedMessage::new(queue, Some(id.to_string()), None);
    assert_eq!(
        letters
            .mark_replayed(&[by_event("orders", a)])
            .await
            .unwrap(),
        0,
        "a record with its own id is marked by that id only"
    );
    let d = Uuid::now_v7();
    for _ in 0..2 {
        let mut old = letter("orders", "old", Some(d), b"{}");
        old.headers.remove("x-outbox-dead-letter-id");
        database.record_dead_letter(&old).await.unwrap();
    }
    assert_eq!(
        letters
            .mark_replayed(&[by_event("orders", d)])
            .await
            .unwrap(),
        1,
        "one copy replayed, one record"
    );
    assert_eq!(
        letters
            .mark_replayed(&[by_event("payments", d)])
            .await
            .unwrap(),
        0,
        "another queue's"
    );
    assert_eq!(
        letters
            .mark_replayed(&[by_event("orders", d)])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        letters
            .mark_replayed(&[by_event("orders", d)])
            .await
            .unwrap(),
        0,
        "once"
    );
    assert_eq!(letters.mark_replayed(&[]).await.unwrap(), 0);
    let own = |i: usize| {
        ReplayedMessage::new(
            "orders",
            None,
            Some(Uuid::parse_str(&recorded[i].headers["x-outbox-dead-letter-id"]).unwrap()),
        )
    };
    assert_eq!(letters.mark_replayed(&[own(0), own(1)]).await.unwrap(), 2);
    // A purge marks the records up to the watermark read before it: a
    // letter recorded after that is still in the queue and stays open.
    let watermark = letters.watermark().await.unwrap();
    assert_eq!(watermark, ids[3] + 2, "the largest id");
    let late = letter("orders", "late", Some(Uuid::now_v7()), b"{}");
    database.record_dead_letter(&late).await.unwrap();
    let orders = ["orders".to_owned(), "elsewhere".to_owned()];
    assert_eq!(letters.mark_purged(&orders, watermark).await.unwrap(), 1);
    let open = letters
        .list(&DeadLetterQuery::new().payloads(false))
        .await
        .unwrap();
    assert_eq!(open.items.len(), 1, "{open:?}");
    assert_eq!(open.items[0].letter.reason, "late");
    assert!(open.items[0].redacted && open.items[0].letter.payload.is_empty());
    assert!(open.items[0].letter.headers.is_empty(), "not read");
    assert_eq!(
        letters
            .mark_purged(&orders, letters.watermark().await.unwrap())
            .await
            .unwrap(),
        1
    );
    let open = letters
        .list(&DeadLetterQuery::new().limit(10))
        .await
        .unwrap();
    assert!(open.items.is_empty(), "{open:?}");
    let every = letters
        .list(&DeadLetterQuery::new().limit(10).include_settled(true))
        .await
        .unwrap();
    assert_eq!(every.items.len(), 7);
    assert!(every.items[0].replayed_at.is_some());
    assert!(
        every.items[2].replayed_at.is_some(),
        "the undecodable one, by its id"
    );
    assert!(every.items[3].purged_at.is_some() && every.items[3].replayed_at.is_none());
    assert!(every.items[4].replayed_at.is_some() && every.items[5].replayed_at.is_some());
    assert_eq!(letters.groups(Some("orders")).await.unwrap(), []);
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letter_verbs_write_their_audit_row_before_acting_and_end_it() {
    let (db, mut conn) = migrated("dead-letters-audit").await;
    let letters = SqliteDeadLetters::new(sqlite::pool(&db.url(), 2).unwrap());
    let entry = AuditEntry::new(
        "alice",
        "dlq_replay",
        serde_json::json!({"queue": "q.dead"}),
    );
    let audit = letters.begin_audit(&entry).await.unwrap();
    let mut row = async |sql: &str| {
        let sql = format!("SELECT count(*) AS n FROM outbox_audit WHERE {sql}");
        count(&mut conn, &sql).await
    };
    assert_eq!(
        row(&format!(
            "id = {audit} AND finished_at IS NULL AND count = 0 AND outcome IS NULL"
        ))
        .await,
        1
    );
    letters.record_audit(audit, 7, None).await.unwrap();
    assert_eq!(
        row(&format!(
            "id = {audit} AND finished_at IS NULL AND count = 7"
        ))
        .await,
        1
    );
    letters.record_audit(audit, 9, Some("done")).await.unwrap();
    assert_eq!(
        row(&format!(
            "id = {audit} AND finished_at >= at AND count = 9 AND outcome = 'done' \
             AND identity = 'alice' AND action = 'dlq_replay' \
             AND target ->> '$.queue' = 'q.dead'"
        ))
        .await,
        1
    );
}
