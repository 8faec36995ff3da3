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
