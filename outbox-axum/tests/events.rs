//! Events outside `Tx`: unflushed events fail loudly, `standalone` writes
//! them, `flush` follows the user's own transaction; and the relay wakeup.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::{Cmd, TestDb, client, oneshot, request, routes, send, serve, within};
use outbox_axum::OutboxLayer;
use outbox_core::testing::RecordingPublisher;
use outbox_core::{Relay, RelayHandle};
use outbox_diesel::PgOutboxStore;

fn layer(db: &TestDb) -> OutboxLayer {
    OutboxLayer::new(db.pool.clone()).outbox(db.outbox.clone())
}

#[tokio::test]
async fn events_neither_flushed_nor_committed_fail_the_request() {
    let db = TestDb::new("unflushed").await;
    let (router, _) = routes(&db);
    let app = router.layer(layer(&db));
    let addr = serve(app.clone()).await;

    let reply = oneshot(
        &app,
        request("/events-only", &Cmd::named("lost").status(200)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!reply.error().is_empty());
    let reply = send(
        &client(),
        addr,
        request("/events-only", &Cmd::named("lost").status(200)),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    // An error response drops them quietly, as with `Tx`.
    let reply = oneshot(
        &app,
        request("/events-only", &Cmd::named("refused").status(400)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(db.counts().await, (0, 0));
}

#[tokio::test]
async fn standalone_writes_unflushed_events_in_their_own_transaction() {
    let db = TestDb::new("standalone").await;
    let (router, _) = routes(&db);
    let app = router.layer(layer(&db).standalone(true));
    let addr = serve(app.clone()).await;

    let reply = oneshot(
        &app,
        request("/events-only", &Cmd::named("one").status(200)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let reply = send(
        &client(),
        addr,
        request("/events-only", &Cmd::named("two").status(202)),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    let reply = oneshot(&app, request("/events-only", &Cmd::named("no").status(409))).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(
        db.counts().await,
        (0, 2),
        "stored for the 2xx responses only"
    );
    // With `Tx` nothing changes: the events go into the request transaction.
    let reply = oneshot(&app, request("/orders", &Cmd::named("tx"))).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(db.counts().await, (1, 3));
}

#[tokio::test]
async fn flushed_events_are_stored_iff_the_users_transaction_commits() {
    let db = TestDb::new("flush").await;
    let (router, _) = routes(&db);
    let app = router.layer(layer(&db));
    let addr = serve(app.clone()).await;

    let reply = oneshot(&app, request("/own-tx", &Cmd::named("kept").status(200))).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(db.counts().await, (1, 1));

    let rolled_back = Cmd {
        rollback: true,
        ..Cmd::named("undone").status(200)
    };
    let reply = send(&client(), addr, request("/own-tx", &rolled_back))
        .await
        .unwrap();
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "flushed events are not 'unwritten'"
    );
    assert_eq!(
        db.counts().await,
        (1, 1),
        "rolled back with the user's transaction"
    );
    let events = db.events().await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].aggregate_id, db.order_ids().await[0].to_string());
}

#[tokio::test]
async fn the_relay_is_woken_after_commit() {
    let db = TestDb::new("relay").await;
    let publisher = RecordingPublisher::new();
    let handle = RelayHandle::new();
    let store = PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .build()
        .unwrap();
    // Polls every 10 s and has no LISTEN: only an in-process wakeup is fast.
    let relay = Relay::builder(store, publisher.clone())
        .poll_interval(Duration::from_secs(10))
        .handle(handle.clone())
        .build()
        .unwrap();
    let running = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_millis(500)).await; // first (empty) claim done

    // Control: the same commit without `.relay(handle)` is not published
    // before the next poll.
    let (router, _) = routes(&db);
    let silent = router.layer(layer(&db));
    let reply = oneshot(&silent, request("/orders", &Cmd::named("silent"))).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let early = tokio::time::timeout(Duration::from_millis(1500), publisher.wait_for(1)).await;
    assert!(
        early.is_err(),
        "published without a wakeup: the test proves nothing"
    );

    let (router, _) = routes(&db);
    let app = router.layer(layer(&db).relay(handle.clone()));
    let addr = serve(app).await;
    let reply = send(&client(), addr, request("/orders", &Cmd::named("woken")))
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    let committed = Instant::now();
    tokio::time::timeout(Duration::from_secs(1), publisher.wait_for(2))
        .await
        .expect("the relay publishes within 1 s of the commit");
    println!("commit to publish: {:?}", committed.elapsed());
    let published: Vec<String> = publisher
        .published()
        .iter()
        .map(|e| e.aggregate_id.clone())
        .collect();
    let ids: Vec<String> = db.order_ids().await.iter().map(i64::to_string).collect();
    assert_eq!(published, ids);

    handle.shutdown();
    within(10, "relay shutdown", running).await.unwrap();
}
