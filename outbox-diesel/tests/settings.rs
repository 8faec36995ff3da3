//! `PgSettings`: the recorder, the store and the inbox taken from one value
//! work on the same outbox, with the settings given once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{TestDb, moved};
use diesel_async::AsyncConnection as _;
use outbox_core::{Claim as _, InboxOutcome, InboxStore as _, OutboxStore as _};
use outbox_diesel::{Error, PgSettings};

#[tokio::test]
async fn parts_from_one_settings_value_share_the_schema() {
    let db = TestDb::new("settings_parts").await;
    // Prepared statements off everywhere (as behind an old PgBouncer), and
    // no NOTIFY: set once, obeyed by every part.
    let settings = PgSettings::new(&db.schema)
        .unwrap()
        .prepared_statements(false)
        .notify(false);
    let outbox = settings.outbox();
    assert!(!outbox.notifies());
    assert!(!outbox.prepares_statements());
    let store = settings.store(db.pool.clone()).build().unwrap();
    let inbox = settings.inbox();
    assert_eq!(inbox.schema().name(), db.schema);

    let mut conn = db.conn().await;
    let id = conn
        .transaction::<_, Error, _>(async |conn| outbox.record(conn, &moved("p-1", 1)).await)
        .await
        .unwrap();

    // The store built from the same settings claims what the recorder wrote.
    let claim = store
        .claim(10)
        .await
        .unwrap()
        .expect("the event is claimable");
    assert_eq!(claim.records().len(), 1);
    assert_eq!(claim.records()[0].envelope.id, id);
    claim.finish().await.unwrap();

    // The inbox from the same settings deduplicates in that schema.
    let first = conn
        .transaction::<_, Error, _>(async |conn| inbox.receive(conn, "c", id).await)
        .await
        .unwrap();
    let again = conn
        .transaction::<_, Error, _>(async |conn| inbox.receive(conn, "c", id).await)
        .await
        .unwrap();
    assert_eq!(first, InboxOutcome::FirstTime);
    assert_eq!(again, InboxOutcome::Duplicate);
}

/// A store taken from one schema's settings and moved to another with
/// `.schema(..)` works on the other schema only: its claims, marks and the
/// admin's filtered reads and chunked mutations (whose fixed binds come
/// before the filter's) never touch the settings' schema.
#[tokio::test]
async fn a_store_moved_to_another_schema_reads_and_changes_only_that_one() {
    use outbox_core::NextStep;
    use outbox_core::admin::{Admin, Caller, EventFilter};
    use outbox_core::testing::fail_claimed;

    let first = TestDb::new("settings_first").await;
    let second = TestDb::new("settings_second").await;
    let kept = common::record(&first, &[("a".into(), 1), ("b".into(), 1)]).await;
    let ids = common::record(
        &second,
        &[("a".into(), 1), ("b".into(), 1), ("c".into(), 1)],
    )
    .await;
    let store = PgSettings::new(&first.schema)
        .unwrap()
        .store(second.pool.clone())
        .schema(&second.schema)
        .build()
        .unwrap();
    fail_claimed(&store, &ids[..2], 5, NextStep::Dead, |id| {
        format!("NOT_FOUND ({id})")
    })
    .await
    .unwrap();

    let admin = Admin::new(store);
    let groups = admin.failure_groups(&EventFilter::new()).await.unwrap();
    assert_eq!(groups.len(), 1, "{groups:#?}");
    assert_eq!(groups[0].dead, 2);
    // Every kind of condition at once: ids, aggregate, group, status.
    let filter = EventFilter::new()
        .with_ids(vec![ids[0], ids[2]])
        .with_aggregate("piece", "a")
        .with_group(groups[0].id.clone())
        .with_status(outbox_core::EventStatus::Dead);
    let page = admin.list(&filter, None, 10).await.unwrap();
    let listed: Vec<_> = page.items.iter().map(|e| e.id).collect();
    assert_eq!(listed, [ids[0]]);
    let report = admin
        .replay(&Caller::operator("alice"), &filter, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    let status = admin.status().await.unwrap();
    assert_eq!(
        (status.counts.pending, status.counts.dead),
        (2, 1),
        "{status:#?}"
    );
    // The settings' own schema was never touched.
    let untouched = first.count("outbox_events", "WHERE status = 'pending' AND attempts = 0");
    assert_eq!(untouched, i64::try_from(kept.len()).unwrap());
}
