//! Cancelled requests, timeouts, an exhausted pool and a database that is
//! down: nothing half-committed, no poisoned connection, no hang.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use common::{Cmd, TestDb, client, oneshot, request, routes, send, serve, within};
use outbox_axum::OutboxLayer;
use tower::ServiceExt as _;
use tower_http::timeout::TimeoutLayer;

fn layer(db: &TestDb) -> OutboxLayer {
    OutboxLayer::new(db.pool.clone()).outbox(db.outbox.clone())
}

#[tokio::test]
async fn a_cancelled_request_rolls_back_and_the_pool_keeps_working() {
    let db = TestDb::with_pool("cancel", 4).await;
    let (router, gate) = routes(&db);
    let app = router.layer(layer(&db));
    let addr = serve(app.clone()).await;

    // Over TCP: the client goes away while the handler is inside its
    // transaction (row inserted, event staged).
    let http = client();
    let pending = tokio::spawn({
        let http = http.clone();
        async move { send(&http, addr, request("/hold", &Cmd::named("abandoned"))).await }
    });
    within(10, "handler entered", gate.entered.notified()).await;
    pending.abort(); // drops the request future: hyper closes the connection
    within(10, "server noticed the disconnect", gate.dropped.notified()).await;
    gate.release.notify_waiters();

    // Through `oneshot`: the response future itself is dropped.
    let pending = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(request("/hold", &Cmd::named("dropped"))).await }
    });
    within(10, "handler entered", gate.entered.notified()).await;
    pending.abort();
    within(10, "future dropped", gate.dropped.notified()).await;
    gate.release.notify_waiters();

    db.assert_no_open_transaction().await;
    assert_eq!(db.counts().await, (0, 0));

    // The pool (4 connections) serves 50 more requests, some of them on
    // the connections the cancelled requests did not return.
    for i in 0..50 {
        let reply = if i % 2 == 0 {
            oneshot(&app, request("/orders", &Cmd::named("after"))).await
        } else {
            send(&http, addr, request("/orders", &Cmd::named("after")))
                .await
                .unwrap()
        };
        assert_eq!(
            reply.status,
            StatusCode::CREATED,
            "request {i}: {:?}",
            reply.body
        );
    }
    assert_eq!(
        db.counts().await,
        (50, 50),
        "the cancelled rows never appear"
    );
}

#[tokio::test]
async fn a_timeout_layer_outside_rolls_back() {
    let db = TestDb::new("timeout").await;
    let (router, _) = routes(&db);
    let app = router
        .layer(layer(&db))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            // Long enough for the quick request below on a loaded machine
            // (300 ms was not, with compilers on both cores).
            Duration::from_secs(1),
        ));
    let slow = Cmd {
        sleep_ms: 3_000,
        ..Cmd::named("slow")
    };
    let reply = oneshot(&app, request("/orders", &slow)).await;
    assert_eq!(reply.status, StatusCode::REQUEST_TIMEOUT);
    db.assert_no_open_transaction().await;
    assert_eq!(db.counts().await, (0, 0));
    let reply = oneshot(&app, request("/orders", &Cmd::named("quick"))).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(db.counts().await, (1, 1));
}

#[tokio::test]
async fn two_hundred_concurrent_requests_on_a_pool_of_ten() {
    let db = TestDb::with_pool("concurrent", 10).await;
    let (router, _) = routes(&db);
    let app = router.layer(layer(&db).acquire_timeout(Duration::from_secs(2)));
    let addr = serve(app.clone()).await;
    let http = client();

    let started = Instant::now();
    let requests = (0..200).map(|i| {
        let (http, app) = (http.clone(), app.clone());
        tokio::spawn(async move {
            let req = request("/orders", &Cmd::named(&format!("order {i}")));
            if i % 4 == 0 {
                oneshot(&app, req).await
            } else {
                send(&http, addr, req).await.unwrap()
            }
        })
    });
    let replies = within(
        60,
        "200 concurrent requests",
        futures_util::future::join_all(requests),
    )
    .await;
    let elapsed = started.elapsed();

    let mut created = BTreeSet::new();
    let mut unavailable = 0;
    for reply in replies {
        let reply = reply.unwrap();
        match reply.status {
            StatusCode::CREATED => assert!(created.insert(reply.id())),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(reply.headers["retry-after"], "1");
                assert!(!reply.error().is_empty());
                unavailable += 1;
            }
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
    assert_eq!(created.len() + unavailable, 200);
    let stored: BTreeSet<i64> = db.order_ids().await.into_iter().collect();
    assert_eq!(stored, created, "rows match the 201 responses exactly");
    let events: BTreeSet<i64> = db
        .events()
        .await
        .iter()
        .map(|e| e.aggregate_id.parse().unwrap())
        .collect();
    assert_eq!(events, created, "one event per committed order");
    println!(
        "200 requests on 10 connections: {} created, {unavailable} unavailable, {elapsed:?}",
        created.len()
    );
    db.assert_no_open_transaction().await;
}

#[tokio::test]
async fn an_exhausted_pool_is_a_503_with_retry_after() {
    let db = TestDb::with_pool("exhausted", 1).await;
    let (router, gate) = routes(&db);
    let app = router.layer(
        layer(&db)
            .acquire_timeout(Duration::from_millis(200))
            .retry_after(Duration::from_secs(3)),
    );
    let addr = serve(app.clone()).await;
    let http = client();

    // The one connection is held by a request waiting on the gate.
    let holder = tokio::spawn({
        let http = http.clone();
        async move { send(&http, addr, request("/hold", &Cmd::named("holder"))).await }
    });
    within(10, "holder entered", gate.entered.notified()).await;

    let started = Instant::now();
    let reply = send(&http, addr, request("/orders", &Cmd::named("waits")))
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reply.headers["retry-after"], "3");
    assert_eq!(reply.headers["content-type"], "application/json");
    assert!(reply.error().contains("retry"), "{}", reply.error());
    let reply = oneshot(&app, request("/orders", &Cmd::named("waits too"))).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);

    gate.release.notify_waiters();
    let reply = within(10, "holder", holder).await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(db.counts().await, (1, 1), "only the holder's order");
}

#[tokio::test]
async fn a_database_that_is_down_is_a_503_and_does_not_touch_other_routes() {
    let db = TestDb::new("db_down").await;
    let (router, _) = routes(&db);
    // Nothing listens on port 1: connections are refused.
    let down = outbox_diesel::pool("postgres://postgres@127.0.0.1:1/postgres", 2).unwrap();
    let app: Router = router.layer(OutboxLayer::new(down).outbox(db.outbox.clone()));
    let addr = serve(app.clone()).await;

    let reply = within(
        10,
        "request",
        send(&client(), addr, request("/orders", &Cmd::named("x"))),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    let reply = oneshot(&app, request("/health", &Cmd::default())).await;
    assert_eq!(reply.status, StatusCode::OK, "no Tx, no database needed");
}
