//! The example e-commerce service (`examples/ecommerce`) end to end: the
//! real `ecommerce` binary, its roles (`api`, `relay`, `inventory`,
//! `loyalty`) started as separate processes, against the real PostgreSQL
//! and RabbitMQ, driven over HTTP.
//!
//! Each test gets its own database (`ecommerce_test_<pid>_<n>`, created by
//! the service itself, dropped at the end), its own exchange and queue
//! prefix (deleted at the end) and a free port; every process it started is
//! killed when it ends, also when it fails (then the tail of each process's
//! log is printed, and the logs are kept under `target/tmp/ecommerce/`).
//! Effects are eventual, so assertions poll with a deadline.
//!
//! Needs PostgreSQL, MariaDB and RabbitMQ at `DATABASE_URL`, `MYSQL_URL`
//! and `AMQP_URL` (defaults: the local servers of `scripts/dev-services`).
//! The tests of the service's contract (`on_each_backend!`) run once per
//! database back end: PostgreSQL, MariaDB, and SQLite (a file of the test).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod shop;

use std::collections::HashMap;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::message::Delivery;
use outbox::rabbitmq::{DEAD_REASON_HEADER, wire};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use shop::{Backend, Footprint, Shop, eventually};

/// Runs the test body `$body(backend)` once per database back end, as the
/// tests `$body::postgres`, `$body::mariadb` and `$body::sqlite`: the
/// service's HTTP and wire contract is the same on each.
macro_rules! on_each_backend {
    ($body:ident) => {
        mod $body {
            use super::Backend;

            #[tokio::test(flavor = "multi_thread")]
            async fn postgres() {
                super::$body(Backend::Postgres).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn mariadb() {
                super::$body(Backend::Mysql).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn sqlite() {
                super::$body(Backend::Sqlite).await;
            }
        }
    };
}

on_each_backend!(place_pay_and_cancel_move_stock_and_points_and_every_role_stops_on_sigterm);
async fn place_pay_and_cancel_move_stock_and_points_and_every_role_stops_on_sigterm(
    backend: Backend,
) {
    let mut shop = Shop::on(backend, "flows").await;
    shop.capture().await;
    shop.start(&["api", "relay", "inventory", "loyalty"]).await;
    shop.set_stock("mug", 10).await;
    shop.set_stock("tea", 5).await;
    let customer = Uuid::now_v7();

    // Place: 201 with the order, stock reserved by the inventory.
    let (status, placed) = shop
        .post(
            "/orders",
            json!({"customer_id": customer, "items": [
                {"sku": "mug", "quantity": 2, "unit_price_cents": 1250},
                {"sku": "tea", "quantity": 1, "unit_price_cents": 499},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{placed}");
    let a: Uuid = placed["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        placed,
        json!({"id": a, "customer_id": customer, "status": "placed", "total_cents": 2999, "items": [
            {"sku": "mug", "quantity": 2, "unit_price_cents": 1250},
            {"sku": "tea", "quantity": 1, "unit_price_cents": 499},
        ]})
    );
    eventually("mug after placing", (8, 2), || shop.stock("mug")).await;
    eventually("tea after placing", (4, 1), || shop.stock("tea")).await;
    let (status, got) = shop.get(&format!("/orders/{a}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got, placed, "GET shows the order as placed");

    // The wire contract of what the relay published.
    let message = shop.captured("order.placed", a).await;
    let properties = &message.properties;
    assert_eq!(
        properties.content_type().as_ref().unwrap().as_str(),
        "application/json"
    );
    assert_eq!(properties.kind().as_ref().unwrap().as_str(), "order.placed");
    assert_eq!(properties.delivery_mode(), &Some(2));
    let headers = properties.headers().as_ref().unwrap();
    assert_eq!(
        wire::header_str(headers, wire::CE_SOURCE),
        Some("/ecommerce")
    );
    assert_eq!(
        wire::header_str(headers, wire::AGGREGATE_TYPE),
        Some("order")
    );
    assert_eq!(
        wire::header_str(headers, wire::CE_ID),
        properties.message_id().as_ref().map(|id| id.as_str())
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&message.data).unwrap(),
        json!({"order_id": a, "customer_id": customer, "total_cents": 2999, "items": [
            {"sku": "mug", "quantity": 2, "unit_price_cents": 1250},
            {"sku": "tea", "quantity": 1, "unit_price_cents": 499},
        ]})
    );
    let reserved = shop.captured("inventory.reserved", a).await;
    let headers = reserved.properties.headers().as_ref().unwrap();
    assert_eq!(
        wire::header_str(headers, wire::CE_SOURCE),
        Some("/ecommerce")
    );
    assert_eq!(
        wire::header_str(headers, "causation_id"),
        message
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str()),
        "inventory.reserved is caused by order.placed"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&reserved.data).unwrap(),
        json!({"order_id": a, "items": [{"sku": "mug", "quantity": 2}, {"sku": "tea", "quantity": 1}]})
    );

    // Pay: 29 points for 2999 cents.
    shop.transition(a, "pay", "paid").await;
    eventually("points after paying", 29, || shop.points(customer)).await;
    let paid = shop.captured("order.paid", a).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&paid.data).unwrap(),
        json!({"order_id": a, "customer_id": customer, "total_cents": 2999})
    );

    // An unpaid order cancelled: its stock comes back, points unchanged.
    let b = shop.place(customer, &[("mug", 1, 100)]).await;
    eventually("mug after placing b", (7, 3), || shop.stock("mug")).await;
    shop.transition(b, "cancel", "cancelled").await;
    eventually("mug after cancelling b", (8, 2), || shop.stock("mug")).await;
    let cancelled = shop.captured("order.cancelled", b).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&cancelled.data).unwrap(),
        json!({"order_id": b, "customer_id": customer, "total_cents": 100, "was_paid": false})
    );
    assert_eq!(shop.points(customer).await, 29);

    // The paid order cancelled: stock back, points taken back.
    shop.transition(a, "cancel", "cancelled").await;
    eventually("mug after cancelling a", (10, 0), || shop.stock("mug")).await;
    eventually("tea after cancelling a", (5, 0), || shop.stock("tea")).await;
    eventually("points after cancelling a", 0, || shop.points(customer)).await;
    assert_eq!(shop.status(a).await, "cancelled");
    assert_eq!(
        shop.points(Uuid::now_v7()).await,
        0,
        "a customer never seen"
    );

    // Every role stops cleanly on SIGTERM.
    for role in ["api", "relay", "inventory", "loyalty"] {
        let status = shop.terminate(role);
        assert!(status.success(), "{role} exited with {status} on SIGTERM");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn orders_with_an_unknown_or_short_sku_are_rejected_and_leave_stock_unchanged() {
    let mut shop = Shop::new("rejected").await;
    shop.start(&["api", "relay", "inventory"]).await;
    shop.set_stock("mug", 5).await;
    shop.set_stock("tea", 1).await;
    let customer = Uuid::now_v7();

    let unknown = shop
        .place(customer, &[("mug", 1, 100), ("ghost", 1, 100)])
        .await;
    let short = shop
        .place(customer, &[("mug", 2, 100), ("tea", 2, 100)])
        .await;
    eventually("unknown sku", "rejected".to_owned(), || {
        shop.status(unknown)
    })
    .await;
    eventually("short sku", "rejected".to_owned(), || shop.status(short)).await;
    assert_eq!(shop.stock("mug").await, (5, 0), "nothing reserved");
    assert_eq!(shop.stock("tea").await, (1, 0), "nothing reserved");
    assert_eq!(
        shop.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = '{unknown}' \
             AND rejection_reason = 'unknown sku \"ghost\"'"
        ))
        .await,
        1,
        "the inventory's reason is kept"
    );

    // A rejected order can be neither paid nor cancelled.
    for action in ["pay", "cancel"] {
        let (status, body) = shop
            .post(&format!("/orders/{short}/{action}"), Value::Null)
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{action}: {body}");
    }

    // The stock the rejected orders wanted is still all there.
    let fits = shop
        .place(customer, &[("mug", 5, 100), ("tea", 1, 100)])
        .await;
    eventually("mug reserved", (0, 5), || shop.stock("mug")).await;
    eventually("tea reserved", (0, 1), || shop.stock("tea")).await;
    assert_eq!(shop.status(fits).await, "placed");
}

on_each_backend!(http_errors_are_json_with_the_contract_status_and_change_nothing);
async fn http_errors_are_json_with_the_contract_status_and_change_nothing(backend: Backend) {
    let mut shop = Shop::on(backend, "errors").await;
    shop.start(&["api"]).await;
    let customer = Uuid::now_v7();
    shop.set_stock("mug", 3).await;
    let order = shop.place(customer, &[("mug", 1, 100)]).await;

    // Every error is `{"error": "..."}` with the contract's status, and
    // leaves no trace: no order, no item, no outbox event, no stock change.
    let mut footprint = shop.footprint().await;
    assert_eq!(
        (footprint.orders, footprint.outbox_events),
        (1, 1),
        "the order placed"
    );
    let expect_error = async |(status, body): (StatusCode, Value),
                              expected: StatusCode,
                              what: &str,
                              footprint: &Footprint| {
        assert_eq!(status, expected, "{what}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}: errors are {{\"error\": \"...\"}}, got {body}"
        );
        assert_eq!(
            &shop.footprint().await,
            footprint,
            "{what}: nothing is stored"
        );
    };
    let raw = |method: reqwest::Method, path: &str, content_type: &str, body: Vec<u8>| {
        shop.request(
            shop.http
                .request(method, shop.url(path))
                .header("content-type", content_type)
                .body(body),
        )
    };
    let item = |sku: &str, quantity: i64, price: i64| json!({"sku": sku, "quantity": quantity, "unit_price_cents": price});
    let valid = json!({"customer_id": customer, "items": [item("mug", 1, 1)]});

    // 400: malformed JSON, malformed ids in the path.
    for (what, body) in [
        ("truncated JSON", b"{\"customer_id\":".to_vec()),
        (
            "a trailing comma",
            format!(r#"{{"customer_id": "{customer}", "items": [],}}"#).into_bytes(),
        ),
        ("single quotes", b"{'customer_id': 1}".to_vec()),
        ("NaN", br#"{"customer_id": NaN}"#.to_vec()),
        ("an empty body", Vec::new()),
        ("two documents", format!("{valid} {valid}").into_bytes()),
        (
            "invalid UTF-8",
            [br#"{"customer_id": ""#.as_slice(), &[0xff, 0xfe], br#""}"#].concat(),
        ),
    ] {
        let (s, b) = raw(reqwest::Method::POST, "/orders", "application/json", body).await;
        expect_error((s, b), StatusCode::BAD_REQUEST, what, &footprint).await;
    }
    let (s, b) = raw(
        reqwest::Method::PUT,
        "/inventory/mug",
        "application/json",
        b"{\"available\": 1".to_vec(),
    )
    .await;
    expect_error(
        (s, b),
        StatusCode::BAD_REQUEST,
        "malformed stock JSON",
        &footprint,
    )
    .await;
    for path in [
        "/orders/not-a-uuid",
        "/customers/123/points",
        "/inventory/bad%20sku",
    ] {
        expect_error(
            shop.get(path).await,
            StatusCode::BAD_REQUEST,
            path,
            &footprint,
        )
        .await;
    }
    for action in ["pay", "cancel"] {
        let response = shop
            .post(&format!("/orders/xyz/{action}"), Value::Null)
            .await;
        expect_error(response, StatusCode::BAD_REQUEST, action, &footprint).await;
    }

    // 415: a valid body that does not say it is JSON.
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/xml",
    ] {
        let (s, b) = raw(
            reqwest::Method::POST,
            "/orders",
            content_type,
            valid.to_string().into_bytes(),
        )
        .await;
        expect_error(
            (s, b),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            content_type,
            &footprint,
        )
        .await;
    }
    let response = shop
        .request(shop.http.post(shop.url("/orders")).body(valid.to_string()))
        .await;
    expect_error(
        response,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "no content type",
        &footprint,
    )
    .await;
    let (s, b) = raw(
        reqwest::Method::PUT,
        "/inventory/mug",
        "application/x-www-form-urlencoded",
        b"available=1".to_vec(),
    )
    .await;
    expect_error(
        (s, b),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "a form",
        &footprint,
    )
    .await;

    // 422: well-formed JSON, invalid data.
    let nested = format!("{}{}", "[".repeat(30_000), "]".repeat(30_000));
    for (what, body) in [
        ("no items", json!({"customer_id": customer, "items": []})),
        (
            "quantity 0",
            json!({"customer_id": customer, "items": [item("mug", 0, 1)]}),
        ),
        (
            "negative quantity",
            json!({"customer_id": customer, "items": [item("mug", -1, 1)]}),
        ),
        (
            "negative price",
            json!({"customer_id": customer, "items": [item("mug", 1, -1)]}),
        ),
        (
            "the same sku twice",
            json!({"customer_id": customer, "items": [item("mug", 1, 1), item("mug", 2, 1)]}),
        ),
        (
            "an unknown field",
            json!({"customer_id": customer, "items": [item("mug", 1, 1)], "coupon": "x"}),
        ),
        (
            "an unknown item field",
            json!({"customer_id": customer, "items": [{"sku": "mug", "quantity": 1, "unit_price_cents": 1, "colour": "red"}]}),
        ),
        (
            "a malformed customer_id",
            json!({"customer_id": "alice", "items": [item("mug", 1, 1)]}),
        ),
        ("a missing field", json!({"items": [item("mug", 1, 1)]})),
        (
            "a fractional quantity",
            json!({"customer_id": customer, "items": [{"sku": "mug", "quantity": 1.5, "unit_price_cents": 1}]}),
        ),
        (
            "a malformed sku",
            json!({"customer_id": customer, "items": [item("a b", 1, 1)]}),
        ),
        ("a string", json!("an order")),
        ("null", Value::Null),
        ("an empty object", json!({})),
    ] {
        expect_error(
            shop.post("/orders", body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            what,
            &footprint,
        )
        .await;
    }
    // 30,000 nested arrays (60 kB, under the body limit): refused at the
    // first element, never parsed deeply; the API keeps serving.
    let (s, b) = raw(
        reqwest::Method::POST,
        "/orders",
        "application/json",
        nested.into_bytes(),
    )
    .await;
    expect_error(
        (s, b),
        StatusCode::UNPROCESSABLE_ENTITY,
        "30,000 nested arrays",
        &footprint,
    )
    .await;
    for (what, body) in [
        ("negative stock", json!({"available": -1})),
        ("an unknown field", json!({"available": 1, "reserved": 5})),
        ("a string", json!({"available": "many"})),
    ] {
        expect_error(
            shop.put("/inventory/mug", body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            what,
            &footprint,
        )
        .await;
    }

    // 404: unknown ids.
    let unknown = Uuid::now_v7();
    expect_error(
        shop.get(&format!("/orders/{unknown}")).await,
        StatusCode::NOT_FOUND,
        "GET unknown order",
        &footprint,
    )
    .await;
    for action in ["pay", "cancel"] {
        let response = shop
            .post(&format!("/orders/{unknown}/{action}"), Value::Null)
            .await;
        expect_error(response, StatusCode::NOT_FOUND, action, &footprint).await;
    }
    expect_error(
        shop.get("/inventory/unknown-sku").await,
        StatusCode::NOT_FOUND,
        "unknown sku",
        &footprint,
    )
    .await;

    // 413: bodies over the limit (64 KiB), announced or streamed.
    let pad = "x".repeat(100_000);
    let big = json!({"customer_id": customer, "items": [item(&"x".repeat(60), 1, 1)], "pad": pad});
    expect_error(
        shop.post("/orders", big.clone()).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "an oversized body",
        &footprint,
    )
    .await;
    expect_error(
        shop.put("/inventory/mug", json!({"available": 1, "pad": pad}))
            .await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "an oversized stock body",
        &footprint,
    )
    .await;
    expect_error(
        shop.chunked_post("/orders", big.to_string().as_bytes())
            .await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "an oversized chunked body (no Content-Length)",
        &footprint,
    )
    .await;

    // 409: transitions the status does not allow.
    shop.transition(order, "pay", "paid").await;
    footprint = shop.footprint().await;
    let response = shop
        .post(&format!("/orders/{order}/pay"), Value::Null)
        .await;
    expect_error(response, StatusCode::CONFLICT, "paying twice", &footprint).await;
    shop.transition(order, "cancel", "cancelled").await;
    footprint = shop.footprint().await;
    for action in ["pay", "cancel"] {
        let response = shop
            .post(&format!("/orders/{order}/{action}"), Value::Null)
            .await;
        expect_error(response, StatusCode::CONFLICT, action, &footprint).await;
    }

    // Only the successful requests left a trace: one order, three events
    // (placed, paid, cancelled), the stock as set.
    assert_eq!(
        shop.footprint().await,
        Footprint {
            orders: 1,
            order_items: 1,
            outbox_events: 3,
            skus: 1,
            available: 3,
            reserved: 0,
        }
    );
    assert_eq!(shop.stock("mug").await, (3, 0));

    // No relay in this process: the outbox gauges, no relay counters.
    let metrics = shop.metrics().await;
    for gauge in [
        "outbox_backlog",
        "outbox_oldest_unsent_age_seconds",
        "outbox_dead",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!("{gauge} "))),
            "{gauge} missing from /metrics:\n{metrics}"
        );
    }
    assert!(!metrics.contains("outbox_published_total"), "{metrics}");
}

on_each_backend!(duplicates_injected_into_the_consumer_queues_change_nothing);
async fn duplicates_injected_into_the_consumer_queues_change_nothing(backend: Backend) {
    let mut shop = Shop::on(backend, "duplicates").await;
    shop.capture().await;
    shop.start(&["api", "relay", "inventory", "loyalty"]).await;
    shop.set_stock("mug", 10).await;
    let customer = Uuid::now_v7();
    let order = shop.place(customer, &[("mug", 3, 1000)]).await;
    eventually("mug reserved", (7, 3), || shop.stock("mug")).await;
    shop.transition(order, "pay", "paid").await;
    eventually("points", 30, || shop.points(customer)).await;
    let placed = shop.captured("order.placed", order).await;
    let paid = shop.captured("order.paid", order).await;
    let reserved = shop.captured("inventory.reserved", order).await;

    // Every event again, twice, into the queue that consumes it, with the
    // same message id.
    for _ in 0..2 {
        shop.inject(&placed, &shop.queue("inventory")).await;
        shop.inject(&paid, &shop.queue("loyalty")).await;
        shop.inject(&reserved, &shop.queue("orders")).await;
    }
    // The orders consumer runs in the api process: its counter shows the
    // duplicates were seen (and skipped).
    eventually("duplicates seen by the orders consumer", 2, || {
        shop.consumer_counter("outbox_consumer_duplicates_total", "orders")
    })
    .await;
    // The inventory and loyalty consumers handle an order's events in queue
    // order: once the cancel (queued after the copies) has taken effect,
    // the copies have been handled too.
    shop.transition(order, "cancel", "cancelled").await;
    eventually("mug released", (10, 0), || shop.stock("mug")).await;
    eventually("points taken back", 0, || shop.points(customer)).await;

    // One inbox row per event, not per delivery; nothing dead-lettered.
    assert_eq!(shop.inbox_rows("inventory").await, 2, "placed, cancelled");
    assert_eq!(shop.inbox_rows("loyalty").await, 2, "paid, cancelled");
    assert_eq!(shop.inbox_rows("orders").await, 1, "reserved");
    for queue in ["inventory", "loyalty", "orders"] {
        let dead = format!("{}.dead", shop.queue(queue));
        assert_eq!(shop.ready(&dead).await, 0, "{dead}");
    }
    assert_eq!(shop.status(order).await, "cancelled");
}

on_each_backend!(concurrent_orders_reserve_and_award_exactly_once_without_deadlocks);
/// Many orders placed and paid at once, so the inventory and loyalty
/// consumers (four deliveries at a time each) record reservations and
/// awards of different orders concurrently: every unit and point is
/// accounted for, nothing is dead-lettered, and no transaction deadlocked
/// (on MariaDB, `REPEATABLE READ`'s gap locks made such inserts deadlock;
/// the example runs at `READ COMMITTED`).
async fn concurrent_orders_reserve_and_award_exactly_once_without_deadlocks(backend: Backend) {
    const ORDERS: i64 = 40;
    let mut shop = Shop::on(backend, "concurrent").await;
    shop.start(&["api", "relay", "inventory", "loyalty"]).await;
    shop.set_stock("mug", 1000).await;
    shop.set_stock("tea", 1000).await;
    let customer = Uuid::now_v7();
    let orders = futures_util::future::join_all(
        (0..ORDERS).map(|_| shop.place(customer, &[("mug", 1, 100), ("tea", 2, 100)])),
    )
    .await;
    futures_util::future::join_all(
        orders
            .iter()
            .map(|&order| shop.transition(order, "pay", "paid")),
    )
    .await;
    eventually("mug reserved", (1000 - ORDERS, ORDERS), || {
        shop.stock("mug")
    })
    .await;
    eventually("tea reserved", (1000 - 2 * ORDERS, 2 * ORDERS), || {
        shop.stock("tea")
    })
    .await;
    eventually("three points per order", 3 * ORDERS, || {
        shop.points(customer)
    })
    .await;
    assert_eq!(shop.inbox_rows("inventory").await, ORDERS);
    assert_eq!(shop.inbox_rows("loyalty").await, ORDERS);
    for queue in ["inventory", "loyalty", "orders"] {
        let dead = format!("{}.dead", shop.queue(queue));
        assert_eq!(shop.ready(&dead).await, 0, "{dead}");
    }
    for role in ["api", "inventory", "loyalty"] {
        let log = std::fs::read_to_string(shop.log(role)).unwrap();
        assert!(
            !log.contains("Deadlock") && !log.contains("deadlock"),
            "{role} deadlocked:\n{log}"
        );
    }
}

on_each_backend!(a_relay_killed_with_sigkill_and_restarted_loses_nothing);
async fn a_relay_killed_with_sigkill_and_restarted_loses_nothing(backend: Backend) {
    const ORDERS: usize = 40;
    const KILL_AFTER: usize = 10;
    let mut shop = Shop::on(backend, "relay_kill").await;
    shop.start(&["api", "relay", "inventory", "loyalty"]).await;
    shop.set_stock("mug", 1000).await;
    let customer = Uuid::now_v7();

    let mut orders = Vec::new();
    for i in 0..ORDERS {
        if i == KILL_AFTER {
            // Mid-stream: the relay is publishing the orders placed so far.
            shop.kill("relay");
        }
        let order = shop.place(customer, &[("mug", 1, 150)]).await;
        shop.transition(order, "pay", "paid").await;
        orders.push(order);
    }
    assert!(
        shop.unsent_events().await > 0,
        "events wait in the outbox while no relay runs"
    );

    shop.spawn("relay");
    eventually("mug reserved for every order", (1000 - 40, 40), || {
        shop.stock("mug")
    })
    .await;
    eventually("a point per order", 40, || shop.points(customer)).await;
    eventually("outbox drained", 0, || shop.unsent_events()).await;
    assert_eq!(
        shop.inbox_rows("inventory").await,
        i64::try_from(ORDERS).unwrap()
    );
    assert_eq!(
        shop.inbox_rows("loyalty").await,
        i64::try_from(ORDERS).unwrap()
    );
    for order in orders {
        assert_eq!(shop.status(order).await, "paid");
    }
}

/// With retentions of seconds, the janitor beside the relay keeps both
/// tables at what the last seconds produced while orders keep coming, and
/// empties them once traffic stops: nothing sent or received lingers past
/// its retention (plus the janitor's interval and a margin).
#[tokio::test(flavor = "multi_thread")]
async fn with_short_retentions_the_outbox_and_inbox_stop_growing() {
    let mut shop = Shop::new("retention").await;
    shop.env.push(("SENT_RETENTION", "3s".into()));
    shop.env.push(("INBOX_RETENTION", "4s".into()));
    shop.env.push(("JANITOR_INTERVAL", "500ms".into()));
    shop.start(&["api", "relay", "inventory", "loyalty"]).await;
    shop.set_stock("mug", 1_000_000).await;
    let customer = Uuid::now_v7();
    let started = std::time::Instant::now();
    let mut orders: i64 = 0;
    let mut checks = 0;
    let mut last_check = started;
    while started.elapsed() < Duration::from_secs(30) {
        let order = shop.place(customer, &[("mug", 1, 150)]).await;
        shop.transition(order, "pay", "paid").await;
        orders += 1;
        if last_check.elapsed() >= Duration::from_secs(1)
            && started.elapsed() > Duration::from_secs(10)
        {
            last_check = std::time::Instant::now();
            checks += 1;
            let old_sent = shop
                .count(
                    "SELECT count(*) AS n FROM outbox_events WHERE status = 'sent' \
                     AND coalesce(published_at, occurred_at) < now() - interval '8 seconds'",
                )
                .await;
            let old_inbox = shop
                .count(
                    "SELECT count(*) AS n FROM inbox_events \
                     WHERE received_at < now() - interval '9 seconds'",
                )
                .await;
            assert_eq!(
                (old_sent, old_inbox),
                (0, 0),
                "sent events and inbox entries past their retention remain after {:?}",
                started.elapsed()
            );
        }
    }
    assert!(
        orders > 50 && checks >= 15,
        "{orders} orders, {checks} checks"
    );
    eventually("inventory and loyalty saw every order", orders, || {
        shop.points(customer)
    })
    .await;
    eventually("the outbox emptied", 0, || {
        shop.count("SELECT count(*) AS n FROM outbox_events")
    })
    .await;
    eventually("the inbox emptied", 0, || {
        shop.count("SELECT count(*) AS n FROM inbox_events")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_all_role_serves_metrics_from_the_start_and_stops_on_sigterm() {
    let mut shop = Shop::new("all").await;
    shop.start(&["all"]).await;
    let metrics = shop.metrics().await;
    for name in [
        "outbox_backlog",
        "outbox_oldest_unsent_age_seconds",
        "outbox_dead",
        "outbox_published_total",
        "outbox_failed_total",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} missing from /metrics at start:\n{metrics}"
        );
    }

    shop.set_stock("mug", 2).await;
    let customer = Uuid::now_v7();
    let order = shop.place(customer, &[("mug", 2, 250)]).await;
    shop.transition(order, "pay", "paid").await;
    eventually("stock reserved", (0, 2), || shop.stock("mug")).await;
    eventually("points", 5, || shop.points(customer)).await;
    let published = |metrics: String| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("outbox_published_total "))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    // order.placed, inventory.reserved, order.paid.
    eventually("published events", 3, || async {
        published(shop.metrics().await)
    })
    .await;

    let status = shop.terminate("all");
    assert!(status.success(), "all exited with {status} on SIGTERM");
}

/// A stand-in event: [`message`] overwrites its type, version and payload.
#[derive(serde::Serialize)]
struct Injected;

impl outbox::DomainEvent for Injected {
    fn aggregate_type(&self) -> &'static str {
        "order"
    }
    fn event_type(&self) -> &'static str {
        "order.injected"
    }
    fn aggregate_id(&self) -> String {
        "injected".into()
    }
}

/// A message to publish into a queue.
struct Message {
    id: Uuid,
    body: Vec<u8>,
    properties: BasicProperties,
}

/// A message in the service's wire format: `event_type` at `schema_version`
/// for order `order`, with `payload`.
fn message(event_type: &str, schema_version: i32, order: Uuid, payload: &Value) -> Message {
    let mut envelope = outbox::EventEnvelope::from_event(&Injected).unwrap();
    envelope.event_type = event_type.into();
    envelope.schema_version = schema_version;
    envelope.aggregate_id = order.to_string();
    envelope.payload = payload.to_string();
    Message {
        id: envelope.id,
        properties: wire::properties(&envelope, "/ecommerce"),
        body: envelope.payload.into_bytes(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_messages_in_the_consumer_queues_are_dead_lettered_with_the_reason() {
    let mut shop = Shop::new("malformed").await;
    // No relay: every message the consumers see is published by the test.
    shop.start(&["api", "inventory", "loyalty"]).await;
    shop.set_stock("mug", 5).await;
    let customer = Uuid::now_v7();
    let order = shop.place(customer, &[("mug", 1, 100)]).await;
    let stranger = Uuid::now_v7();

    // Per queue, the bad messages and the reason each must be dead-lettered
    // with.
    let loyalty_paid = json!({"order_id": order, "customer_id": stranger, "total_cents": 5000});
    let placed = json!({"order_id": order, "customer_id": customer, "total_cents": 100,
        "items": [{"sku": "mug", "quantity": 1, "unit_price_cents": 100}]});
    let rejected = json!({"order_id": order, "reason": "injected"});
    let bad: Vec<(&str, &str, Message, &str)> = vec![
        (
            "loyalty",
            "not JSON",
            Message {
                body: b"not json {".to_vec(),
                ..message("order.paid", 1, order, &loyalty_paid)
            },
            "cannot decode the message: body is not JSON",
        ),
        (
            "loyalty",
            "no headers",
            {
                let id = Uuid::now_v7();
                let properties = BasicProperties::default()
                    .with_message_id(id.to_string().into())
                    .with_type("order.paid".into())
                    .with_content_type("application/json".into());
                Message {
                    id,
                    body: loyalty_paid.to_string().into_bytes(),
                    properties,
                }
            },
            "cannot decode the message: header `aggregate_type` is missing",
        ),
        (
            "loyalty",
            "an unknown event type",
            message("order.shipped", 1, order, &json!({"order_id": order})),
            "unknown event type order.shipped for consumer loyalty",
        ),
        (
            "loyalty",
            "a schema version it does not read",
            message("order.paid", 2, order, &loyalty_paid),
            "unsupported schema_version 2 of order.paid (supported: 1)",
        ),
        (
            "inventory",
            "an unknown event type",
            message("order.refunded", 1, order, &json!({"order_id": order})),
            "unknown event type order.refunded for consumer inventory",
        ),
        (
            "inventory",
            "a schema version it does not read",
            message("order.placed", 2, order, &placed),
            "unsupported schema_version 2 of order.placed (supported: 1)",
        ),
        (
            "orders",
            "an unknown event type",
            message("inventory.restocked", 1, order, &json!({"sku": "mug"})),
            "unknown event type inventory.restocked for consumer orders",
        ),
        (
            "orders",
            "a schema version it does not read",
            message("inventory.rejected", 3, order, &rejected),
            "unsupported schema_version 3 of inventory.rejected (supported: 1)",
        ),
    ];
    for (queue, _, message, _) in &bad {
        shop.publish_to(
            &shop.queue(queue),
            &message.body,
            message.properties.clone(),
        )
        .await;
    }
    // Then a valid event, behind the bad ones in the loyalty queue.
    let paid_order = Uuid::now_v7();
    let valid = message(
        "order.paid",
        1,
        paid_order,
        &json!({"order_id": paid_order, "customer_id": customer, "total_cents": 1250}),
    );
    shop.publish_to(
        &shop.queue("loyalty"),
        &valid.body,
        valid.properties.clone(),
    )
    .await;
    eventually("the valid event after them is handled", 12, || {
        shop.points(customer)
    })
    .await;

    // Each bad message is in its queue's dead-letter queue, unchanged, with
    // the reason.
    for queue in ["loyalty", "inventory", "orders"] {
        let expected: Vec<_> = bad.iter().filter(|(q, ..)| *q == queue).collect();
        let dead: HashMap<String, Delivery> = shop
            .dead_letters(queue, expected.len())
            .await
            .into_iter()
            .map(|letter| {
                let id = letter.properties.message_id().as_ref().unwrap().to_string();
                (id, letter)
            })
            .collect();
        for (_, what, message, reason) in expected {
            let letter = dead
                .get(&message.id.to_string())
                .unwrap_or_else(|| panic!("{queue}: {what} was not dead-lettered"));
            assert_eq!(
                letter.data, message.body,
                "{queue}: {what}: the body is kept"
            );
            let headers = letter.properties.headers().as_ref().unwrap();
            let got = wire::header_str(headers, DEAD_REASON_HEADER)
                .unwrap_or_else(|| panic!("{queue}: {what}: no {DEAD_REASON_HEADER}"));
            assert!(
                got.starts_with(reason),
                "{queue}: {what}: the reason is {got:?}, expected {reason:?}"
            );
        }
        assert_eq!(shop.ready(&shop.queue(queue)).await, 0, "{queue} drained");
    }

    // None of them was taken as processed: not in the inbox, no effect.
    let ids: Vec<String> = bad
        .iter()
        .map(|(_, _, message, _)| format!("'{}'", message.id))
        .collect();
    assert_eq!(
        shop.count(&format!(
            "SELECT count(*) AS n FROM inbox_events WHERE event_id IN ({})",
            ids.join(", ")
        ))
        .await,
        0,
        "no bad message in the inbox"
    );
    assert_eq!(
        shop.count(&format!(
            "SELECT count(*) AS n FROM inbox_events WHERE consumer = 'loyalty' AND event_id = '{}'",
            valid.id
        ))
        .await,
        1,
        "the valid event is in the inbox"
    );
    assert_eq!(shop.inbox_rows("inventory").await, 0);
    assert_eq!(shop.inbox_rows("orders").await, 0);
    assert_eq!(
        shop.points(stranger).await,
        0,
        "no points for order.paid v2"
    );
    assert_eq!(
        shop.stock("mug").await,
        (5, 0),
        "nothing reserved for order.placed v2"
    );
    assert_eq!(
        shop.status(order).await,
        "placed",
        "not rejected by inventory.rejected v3"
    );
    assert_eq!(
        shop.count("SELECT count(*) AS n FROM reservations").await,
        0,
        "the inventory recorded nothing"
    );

    // Every consumer process is still running.
    for role in ["api", "inventory", "loyalty"] {
        assert!(shop.alive(role), "the {role} process exited");
    }
}

/// The consumers' dead letters through the example's admin API, against
/// the real database and broker: listed from the records (in order,
/// payloads redacted), grouped, replayed back to their queue (and, still
/// bad, dead-lettered again), purged; each action audited with the
/// caller's identity, a read-only token refused.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_listed_replayed_and_purged_through_the_admin_api() {
    const OPERATOR: &str = "operator-token-0123456789";
    const READER: &str = "reader-token-0123456789ab";
    let mut shop = Shop::new("admin_dlq").await;
    shop.env.push(("ADMIN_TOKEN", OPERATOR.to_owned()));
    shop.env.push(("ADMIN_READ_TOKEN", READER.to_owned()));
    // No relay: every message the consumer sees is published by the test.
    shop.start(&["api", "loyalty"]).await;
    let queue = shop.queue("loyalty");
    let dlq = format!("{queue}.dead");
    let order = Uuid::now_v7();
    let bad: Vec<Message> = (0..3)
        .map(|_| message("order.shipped", 1, order, &json!({"order_id": order})))
        .collect();
    for m in &bad {
        shop.publish_to(&queue, &m.body, m.properties.clone()).await;
    }
    async fn open(shop: &Shop) -> Value {
        let path = format!("/admin/dead-letters?queue={}", shop.queue("loyalty"));
        shop.admin_get(READER, &path).await.1["items"].clone()
    }
    eventually("three dead letters recorded", 3, || async {
        open(&shop).await.as_array().map_or(0, Vec::len)
    })
    .await;

    // Listed in order, payloads and headers redacted.
    let items = open(&shop).await;
    let listed: Vec<&str> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_id"].as_str().unwrap())
        .collect();
    let sent: Vec<String> = bad.iter().map(|m| m.id.to_string()).collect();
    assert_eq!(listed, sent);
    assert_eq!(
        (items[0]["redacted"].clone(), items[0]["payload"].clone()),
        (json!(true), json!("")),
        "redacted"
    );
    assert_eq!(items[0]["consumer"], "loyalty");
    let id = items[0]["id"].as_i64().unwrap();
    let (status, shown) = shop
        .admin_get(READER, &format!("/admin/dead-letters/{id}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert!(
        shown["reason"]
            .as_str()
            .unwrap()
            .contains("unknown event type")
    );
    let (status, _) = shop
        .admin_get(READER, "/admin/dead-letters/999999999")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, groups) = shop.admin_get(READER, "/admin/dead-letter-groups").await;
    assert_eq!(groups.as_array().unwrap().len(), 1, "{groups}");
    assert_eq!(groups[0]["count"], 3);

    // Refused without a token and for the read-only one; nothing moves.
    let replay = json!({"queue": dlq, "limit": 2});
    let (status, _) = shop
        .admin_post(None, "/admin/dead-letters/replay", replay.clone())
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = shop
        .admin_post(Some(READER), "/admin/dead-letters/replay", replay.clone())
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, missing) = shop
        .admin_post(
            Some(OPERATOR),
            "/admin/dead-letters/replay",
            json!({"queue": format!("{dlq}.nothing")}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    let (status, dry) = shop
        .admin_post(
            Some(OPERATOR),
            "/admin/dead-letters/replay",
            json!({"queue": dlq, "dry_run": true}),
        )
        .await;
    assert_eq!(
        (status, dry["depth"].clone()),
        (StatusCode::OK, json!(3)),
        "{dry}"
    );
    assert_eq!(shop.ready(&dlq).await, 3);

    // Two go back to the consumer's queue (still bad: dead-lettered again,
    // recorded anew), their records marked replayed.
    let (status, replayed) = shop
        .admin_post(Some(OPERATOR), "/admin/dead-letters/replay", replay)
        .await;
    assert_eq!(status, StatusCode::OK, "{replayed}");
    assert_eq!(replayed["replayed"], 2, "{replayed}");
    assert_eq!(replayed["marked"], 2, "{replayed}");
    let replay_audit = replayed["audit_id"].as_i64().unwrap();
    eventually(
        "the replayed two dead-lettered and recorded again",
        3,
        || async { open(&shop).await.as_array().map_or(0, Vec::len) },
    )
    .await;
    let again: Vec<String> = open(&shop)
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        again,
        [sent[2].clone(), sent[0].clone(), sent[1].clone()],
        "the one left, then the replayed two in their order"
    );
    eventually("all three back in the dead-letter queue", 3, || {
        shop.ready(&dlq)
    })
    .await;

    // Purged: the queue is empty and every open record marked.
    let (status, purged) = shop
        .admin_post(
            Some(OPERATOR),
            "/admin/dead-letters/purge",
            json!({"queue": dlq}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{purged}");
    assert_eq!(
        (purged["purged"].clone(), purged["marked"].clone()),
        (json!(3), json!(3)),
        "{purged}"
    );
    assert_eq!(shop.ready(&dlq).await, 0);
    assert_eq!(open(&shop).await, json!([]));
    let (_, all) = shop
        .admin_get(
            READER,
            &format!("/admin/dead-letters?queue={queue}&all=true"),
        )
        .await;
    assert_eq!(all["items"].as_array().unwrap().len(), 5, "{all}");

    // Both audited as the operator, with counts and outcomes.
    let (_, audit) = shop.admin_get(READER, "/admin/audit").await;
    let purge_row = &audit[0];
    assert_eq!(purge_row["action"], "dlq_purge", "{audit}");
    assert_eq!(purge_row["identity"], "admin");
    assert_eq!(
        (purge_row["count"].clone(), purge_row["outcome"].clone()),
        (json!(3), json!("done: 3 purged, 3 record(s) marked"))
    );
    let replay_row = audit
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == replay_audit)
        .unwrap_or_else(|| panic!("no audit row {replay_audit}: {audit}"));
    assert_eq!(replay_row["action"], "dlq_replay");
    assert_eq!(
        (replay_row["count"].clone(), replay_row["outcome"].clone()),
        (
            json!(2),
            json!("done: 2 replayed, 0 skipped, 2 record(s) marked")
        )
    );
}
