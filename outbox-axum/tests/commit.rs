//! Commit and rollback of the request's transaction, through a real
//! `axum::Router`, with `oneshot` and over TCP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::panic::AssertUnwindSafe;

use axum::Router;
use axum::http::{HeaderName, StatusCode};
use common::{Cmd, TestDb, client, oneshot, request, request_with, routes, send, serve, within};
use futures_util::FutureExt as _;
use outbox_axum::OutboxLayer;
use outbox_core::Headers;
use tower_http::catch_panic::CatchPanicLayer;

fn app(db: &TestDb) -> Router {
    let (router, _) = routes(db);
    router.layer(OutboxLayer::new(db.pool.clone()).outbox(db.outbox.clone()))
}

#[tokio::test]
async fn success_commits_the_business_row_and_its_event_together() {
    let db = TestDb::new("commit_ok").await;
    let app = app(&db);

    let reply = oneshot(&app, request("/orders", &Cmd::named("by oneshot"))).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let first = reply.id();

    let addr = serve(app).await;
    let reply = send(&client(), addr, request("/orders", &Cmd::named("by tcp")))
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    let second = reply.id();

    assert_eq!(db.order_ids().await, [first, second]);
    let events = db.events().await;
    let aggregates: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
    assert_eq!(aggregates, [first.to_string(), second.to_string()]);
    assert!(events.iter().all(|e| e.event_type == "order.placed"));
    db.assert_no_open_transaction().await;
}

#[tokio::test]
async fn error_responses_and_panics_store_nothing() {
    let db = TestDb::new("commit_errors").await;
    let app = app(&db);
    let addr = serve(app.clone().layer(CatchPanicLayer::new())).await;
    let http = client();

    for status in [400, 404, 409, 422, 500, 503] {
        let cmd = Cmd::named("refused").status(status);
        assert_eq!(
            oneshot(&app, request("/orders", &cmd))
                .await
                .status
                .as_u16(),
            status
        );
        let reply = send(&http, addr, request("/orders", &cmd)).await.unwrap();
        assert_eq!(reply.status.as_u16(), status);
    }
    assert_eq!(db.counts().await, (0, 0), "4xx and 5xx roll back");

    // A panic is re-raised after the rollback: without CatchPanic it
    // reaches the caller of the service...
    let panicking = Cmd {
        panic: true,
        ..Cmd::named("panics")
    };
    let outcome = AssertUnwindSafe(oneshot(&app, request("/orders", &panicking)))
        .catch_unwind()
        .await;
    assert!(outcome.is_err(), "the panic propagates to the caller");
    // ...and with CatchPanic outside the layer the client gets a 500.
    let reply = send(&http, addr, request("/orders", &panicking))
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(db.counts().await, (0, 0), "panics roll back");
    db.assert_no_open_transaction().await;

    // The pool is still healthy.
    let reply = send(&http, addr, request("/orders", &Cmd::named("after")))
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(db.counts().await, (1, 1));
}

#[tokio::test]
async fn a_failing_commit_is_a_5xx_and_stores_nothing() {
    let db = TestDb::new("commit_fails").await;
    let app = app(&db);
    let addr = serve(app.clone()).await;
    // The deferred foreign key is checked only at COMMIT.
    let dangling = Cmd {
        parent: Some(987_654_321),
        ..Cmd::named("dangling")
    };

    let reply = oneshot(&app, request("/orders", &dangling)).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.headers["content-type"], "application/json");
    assert!(
        reply.error().contains("could not be committed"),
        "{}",
        reply.error()
    );

    let reply = send(&client(), addr, request("/orders", &dangling))
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);

    assert_eq!(db.counts().await, (0, 0));
    db.assert_no_open_transaction().await;
}

#[tokio::test]
async fn commit_if_decides_which_responses_commit() {
    let db = TestDb::new("commit_if").await;
    let (router, _) = routes(&db);
    let app = router.layer(
        OutboxLayer::new(db.pool.clone())
            .outbox(db.outbox.clone())
            .commit_if(|status| status == StatusCode::SEE_OTHER),
    );
    let created = oneshot(&app, request("/orders", &Cmd::named("2xx"))).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(db.counts().await, (0, 0), "201 no longer commits");
    let redirect = oneshot(&app, request("/orders", &Cmd::named("303").status(303))).await;
    assert_eq!(redirect.status, StatusCode::SEE_OTHER);
    assert_eq!(db.counts().await, (1, 1));
}

#[tokio::test]
async fn events_raised_in_nested_code_join_the_transaction() {
    let db = TestDb::new("nested").await;
    let app = app(&db);
    let addr = serve(app.clone()).await;

    let reply = oneshot(
        &app,
        request_with(
            "/nested",
            &Cmd::named("deep"),
            &[("x-request-id", "req-nested")],
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let id = reply.id();
    assert!(
        reply.json()["unscoped"]
            .as_str()
            .unwrap()
            .contains("no outbox request scope"),
        "a task spawned without the scope cannot raise: {}",
        reply.json()
    );
    let events = db.events().await;
    assert_eq!(events.len(), 2, "nested raise + scoped spawned task");
    for event in &events {
        assert_eq!(event.aggregate_id, id.to_string());
        assert_eq!(
            event.header(Headers::CORRELATION_ID).as_deref(),
            Some("req-nested")
        );
    }

    // The same path with an error response stores neither.
    let reply = send(
        &client(),
        addr,
        request("/nested", &Cmd::named("refused").status(422)),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(db.counts().await, (1, 2));
}

#[tokio::test]
async fn correlation_id_and_trace_context_come_from_the_request() {
    let db = TestDb::new("correlation").await;
    let app = app(&db);
    let addr = serve(app.clone()).await;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    let reply = send(
        &client(),
        addr,
        request_with(
            "/orders",
            &Cmd::named("traced"),
            &[
                ("x-request-id", "req-42"),
                ("traceparent", traceparent),
                ("tracestate", "congo=t61rcWkgMzE"),
            ],
        ),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    let reply = oneshot(
        &app,
        request_with(
            "/orders",
            &Cmd::named("correlated"),
            // A malformed trace context is refused, the request served.
            &[
                ("x-correlation-id", "corr-7"),
                ("traceparent", "garbage"),
                ("tracestate", "congo=t61rcWkgMzE"),
            ],
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let reply = oneshot(&app, request("/orders", &Cmd::named("bare"))).await;
    assert_eq!(reply.status, StatusCode::CREATED);

    let events = db.events().await;
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[0].header(Headers::CORRELATION_ID).as_deref(),
        Some("req-42")
    );
    assert_eq!(
        events[0].header(Headers::TRACEPARENT).as_deref(),
        Some(traceparent)
    );
    assert_eq!(
        events[0].header(Headers::TRACESTATE).as_deref(),
        Some("congo=t61rcWkgMzE")
    );
    assert_eq!(
        events[1].header(Headers::CORRELATION_ID).as_deref(),
        Some("corr-7")
    );
    assert_eq!(events[1].header(Headers::TRACEPARENT), None);
    assert_eq!(events[1].header(Headers::TRACESTATE), None);
    let generated: uuid::Uuid = events[2]
        .header(Headers::CORRELATION_ID)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(generated.get_version_num(), 7);

    // A configured header name replaces the defaults.
    let (router, _) = routes(&db);
    let custom = router.layer(
        OutboxLayer::new(db.pool.clone())
            .outbox(db.outbox.clone())
            .correlation_header(HeaderName::from_static("x-trace-id")),
    );
    let reply = oneshot(
        &custom,
        request_with(
            "/orders",
            &Cmd::named("custom"),
            &[("x-request-id", "ignored"), ("x-trace-id", "trace-9")],
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let events = db.events().await;
    assert_eq!(
        events[3].header(Headers::CORRELATION_ID).as_deref(),
        Some("trace-9")
    );
}

#[tokio::test]
async fn extracting_tx_twice_is_a_clear_500_not_a_deadlock() {
    let db = TestDb::new("twice").await;
    let app = app(&db);
    let reply = within(
        10,
        "second Tx extraction",
        oneshot(&app, request("/twice", &Cmd::default())),
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        reply.error().contains("extracted twice"),
        "{}",
        reply.error()
    );
    db.assert_no_open_transaction().await;
    let reply = oneshot(&app, request("/orders", &Cmd::named("after"))).await;
    assert_eq!(reply.status, StatusCode::CREATED);
}

/// A handler that misbehaves on its transaction (`path`) and still answers
/// 201: the layer must answer 500, store nothing and close the connection
/// rather than pool it; with or without staged events.
async fn misbehaving_handler_is_a_5xx(db: &TestDb, path: &str) {
    let (router, gate) = routes(db);
    let app = router.layer(OutboxLayer::new(db.pool.clone()).outbox(db.outbox.clone()));
    for raise in [false, true] {
        let cmd = Cmd {
            raise,
            ..Cmd::named("phantom")
        };
        let reply = oneshot(&app, request(path, &cmd)).await;
        assert_eq!(
            reply.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{path}, events staged: {raise}: not a phantom 2xx"
        );
        assert!(
            reply.error().contains("could not be committed"),
            "{}",
            reply.error()
        );
        assert_eq!(db.counts().await, (0, 0), "{path}, events staged: {raise}");
        let pid = gate.backend.lock().unwrap().take().unwrap();
        db.assert_backend_closed(pid).await;
    }
    db.assert_no_open_transaction().await;
    // The pool still serves healthy requests.
    let reply = oneshot(&app, request("/orders", &Cmd::named("after"))).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(db.counts().await, (1, 1));
}

#[tokio::test]
async fn a_cancelled_nested_transaction_is_a_5xx_not_a_savepoint_release() {
    let db = TestDb::new("nested_cancelled").await;
    misbehaving_handler_is_a_5xx(&db, "/nested-cancelled").await;
}

#[tokio::test]
async fn a_swallowed_database_error_is_a_5xx_not_a_silent_rollback() {
    let db = TestDb::new("swallowed").await;
    misbehaving_handler_is_a_5xx(&db, "/swallowed-error").await;
}
