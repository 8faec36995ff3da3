//! The admin router: authentication, permissions, redaction and error
//! shapes over the in-memory store (`oneshot`, no server).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use common::{Reply, oneshot};
use outbox_axum::admin::{AdminRouter, BearerTokens, LayerAuth};
use outbox_core::InboxDatabase as _;
use outbox_core::admin::{Admin, Caller, DeadLetter, DeadLetters};
use outbox_core::testing::{
    InMemoryDeadLetterQueues, InMemoryInbox, InMemoryStore, QueuedMessage, TestEvent, fail_claimed,
};
use outbox_core::{Claim, EventStatus, NextStep, OutboxStore, RelayRegistration};
use serde_json::json;
use uuid::Uuid;

const OPERATOR: &str = "op-token-0123456789abcdef";
const READER: &str = "ro-token-0123456789abcdef";

const NO_EXCHANGE: &str = "NOT_FOUND - no exchange 'shop'";

fn record(store: &InMemoryStore, aggregate: &str) -> Uuid {
    let event = TestEvent::new(aggregate).field("secret", "4111 1111 1111 1111");
    store.record(&event).unwrap()
}

/// Claims what is claimable and marks `ids` dead.
async fn kill(store: &InMemoryStore, ids: &[Uuid]) {
    fail_claimed(store, ids, 5, NextStep::Dead, |_| NO_EXCHANGE.into())
        .await
        .unwrap();
}

fn tokens() -> BearerTokens {
    BearerTokens::new()
        .operator("alice", OPERATOR)
        .read_only("grafana", READER)
}

fn router(store: &InMemoryStore) -> Router {
    AdminRouter::builder(Admin::new(store.clone()))
        .auth(tokens())
        .build()
        .unwrap()
}

/// Mounted under `/admin`, as users do.
fn app(admin: Router) -> Router {
    Router::new().nest("/admin", admin)
}

fn get(path: &str, token: Option<&str>) -> Request<Body> {
    let mut request = Request::get(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(Body::empty()).unwrap()
}

fn post(path: &str, token: Option<&str>, body: &str) -> Request<Body> {
    let mut request = Request::post(path).header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(Body::from(body.to_owned())).unwrap()
}

fn replay_body(id: Uuid) -> String {
    json!({ "filter": { "ids": [id] } }).to_string()
}

fn assert_error(reply: &Reply, status: StatusCode, needle: &str) {
    assert_eq!(
        reply.status,
        status,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.headers["content-type"], "application/json");
    let error = reply.error();
    assert!(
        error.contains(needle),
        "{error:?} should contain {needle:?}"
    );
}

#[tokio::test]
async fn no_token_or_a_wrong_one_is_401_with_the_bearer_challenge() {
    let store = InMemoryStore::new();
    let app = app(router(&store));
    for request in [
        get("/admin/status", None),
        get("/admin/status", Some("op-token-0123456789abcdeX")),
        get("/admin/status", Some(&OPERATOR[..OPERATOR.len() - 1])),
        get("/admin/status", Some(&format!("{OPERATOR}x"))),
        // The token in another scheme.
        Request::get("/admin/status")
            .header("authorization", format!("Basic {OPERATOR}"))
            .body(Body::empty())
            .unwrap(),
        // Unauthenticated before the (malformed) body is read.
        post("/admin/replay", None, "{not json"),
    ] {
        let uri = request.uri().clone();
        let reply = oneshot(&app, request).await;
        assert_error(&reply, StatusCode::UNAUTHORIZED, "not authenticated");
        let challenge = reply.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.starts_with("Bearer"), "{uri}: {challenge}");
    }
}

#[tokio::test]
async fn a_read_only_token_reads_but_its_replay_is_403_and_changes_nothing() {
    let store = InMemoryStore::new();
    let id = record(&store, "a");
    kill(&store, &[id]).await;
    let app = app(router(&store));

    let reply = oneshot(&app, get("/admin/status", Some(READER))).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["counts"]["dead"], 1, "{}", reply.json());

    for body in [replay_body(id), "{\"filter\": {}}".to_owned()] {
        let reply = oneshot(&app, post("/admin/replay", Some(READER), &body)).await;
        assert_error(&reply, StatusCode::FORBIDDEN, "grafana may only read");
    }
    for (path, body) in [
        ("/admin/retry-now", replay_body(id)),
        ("/admin/skip", json!({ "id": id }).to_string()),
        (
            "/admin/purge",
            json!({ "target": "sent", "older_than_seconds": 0 }).to_string(),
        ),
        ("/admin/relays/r1/pause", String::new()),
    ] {
        let reply = oneshot(&app, post(path, Some(READER), &body)).await;
        assert_error(&reply, StatusCode::FORBIDDEN, "may only read");
    }
    assert_eq!(store.get(id).unwrap().status, EventStatus::Dead);
    let audit = oneshot(&app, get("/admin/audit", Some(READER))).await;
    assert_eq!(audit.json(), json!([]), "nothing was audited");
}

#[tokio::test]
async fn an_http_replay_keeps_order_and_is_audited_with_the_token_identity() {
    let store = InMemoryStore::new();
    let first = record(&store, "a");
    let second = record(&store, "a");
    kill(&store, &[first, second]).await;
    let app = app(router(&store));

    let dry = json!({ "filter": { "ids": [second] }, "dry_run": true }).to_string();
    let reply = oneshot(&app, post("/admin/replay", Some(OPERATOR), &dry)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["dry_run"], true);
    assert_eq!(reply.json()["matched"], 1);
    assert_eq!(store.get(second).unwrap().status, EventStatus::Dead);

    let reply = oneshot(
        &app,
        post("/admin/replay", Some(OPERATOR), &replay_body(second)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["changed"], 1);
    assert!(
        store.claim(10).await.unwrap().is_none(),
        "held behind the first"
    );

    oneshot(
        &app,
        post("/admin/replay", Some(OPERATOR), &replay_body(first)),
    )
    .await;
    let claim = store.claim(10).await.unwrap().unwrap();
    let ids: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(ids, [first, second]);

    let audit = oneshot(&app, get("/admin/audit", Some(READER)))
        .await
        .json();
    let audit = audit.as_array().unwrap();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert!(
        audit.iter().all(|row| row["identity"] == "alice"
            && row["action"] == "replay"
            && row["count"] == 1),
        "{audit:?}"
    );
}

#[tokio::test]
async fn payloads_are_redacted_unless_allowed() {
    let store = InMemoryStore::new();
    let id = record(&store, "a");
    let path = format!("/admin/events/{id}");

    let reply = oneshot(&app(router(&store)), get(&path, Some(READER))).await;
    assert_eq!(reply.status, StatusCode::OK);
    let detail = reply.json();
    assert_eq!(detail["id"], id.to_string());
    assert!(detail["payload"].is_null() && detail["headers"].is_null());
    assert!(!String::from_utf8_lossy(&reply.body).contains("4111"));

    let open = AdminRouter::builder(Admin::new(store.clone()))
        .auth(tokens())
        .allow_payloads(true)
        .build()
        .unwrap();
    let detail = oneshot(&app(open), get(&path, Some(READER))).await.json();
    assert_eq!(detail["payload"]["secret"], "4111 1111 1111 1111");
}

/// An inbox with `n` recorded dead letters of `origin` in `origin.dead`, and
/// the broker holding them; the router over both.
async fn dead_letter_router(
    origin: &str,
    n: usize,
    allow_payloads: bool,
) -> (InMemoryInbox, InMemoryDeadLetterQueues, Router) {
    let inbox = InMemoryInbox::new();
    let broker = InMemoryDeadLetterQueues::new();
    broker.declare("orders");
    for _ in 0..n {
        let event = Uuid::now_v7();
        let mut letter =
            DeadLetter::new("loyalty", origin, "x", "k", "bad", b"{\"card\": \"4111\"}");
        letter.event_id = Some(event);
        letter
            .headers
            .insert("x-outbox-dead-letter-id".into(), event.to_string());
        inbox.record_dead_letter(&letter).await.unwrap();
        broker.push(
            &format!("{origin}.dead"),
            QueuedMessage::new(
                Some(event.to_string()),
                Some(event),
                Some(origin.to_owned()),
            ),
        );
    }
    let admin = AdminRouter::builder(Admin::new(InMemoryStore::new()))
        .dead_letters(DeadLetters::new(inbox.clone(), broker.clone()))
        .auth(tokens())
        .allow_payloads(allow_payloads)
        .build()
        .unwrap();
    (inbox, broker, app(admin))
}

#[tokio::test]
async fn dead_letters_are_listed_redacted_and_replayed_by_operators_only() {
    let (inbox, broker, app) = dead_letter_router("orders", 2, false).await;

    let reply = oneshot(&app, get("/admin/dead-letters", None)).await;
    assert_error(&reply, StatusCode::UNAUTHORIZED, "not authenticated");
    let page = oneshot(
        &app,
        get("/admin/dead-letters?queue=orders&limit=1", Some(READER)),
    )
    .await
    .json();
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert!(page["next"].is_i64());
    let first = &page["items"][0];
    assert_eq!(
        (
            first["redacted"].clone(),
            first["payload"].clone(),
            first["headers"].clone()
        ),
        (json!(true), json!(""), json!({})),
        "{first}"
    );
    let id = first["id"].as_i64().unwrap();
    let shown = oneshot(
        &app,
        get(&format!("/admin/dead-letters/{id}"), Some(READER)),
    )
    .await;
    assert_eq!(shown.status, StatusCode::OK);
    assert!(!String::from_utf8_lossy(&shown.body).contains("4111"));
    let groups = oneshot(&app, get("/admin/dead-letter-groups", Some(READER)))
        .await
        .json();
    assert_eq!(groups[0]["count"], 2);

    let replay = json!({"queue": "orders.dead"}).to_string();
    let reply = oneshot(
        &app,
        post("/admin/dead-letters/replay", Some(READER), &replay),
    )
    .await;
    assert_error(&reply, StatusCode::FORBIDDEN, "operator");
    assert_eq!(broker.messages("orders.dead").len(), 2, "nothing moved");
    let reply = oneshot(
        &app,
        post("/admin/dead-letters/replay", Some(OPERATOR), &replay),
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let outcome = reply.json();
    assert_eq!(
        (outcome["replayed"].clone(), outcome["marked"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(broker.messages("orders").len(), 2);
    assert_eq!(inbox.audit_log()[0].entry.identity, "alice");

    let (_, _, open) = dead_letter_router("orders", 1, true).await;
    let page = oneshot(&open, get("/admin/dead-letters", Some(READER)))
        .await
        .json();
    assert_eq!(page["items"][0]["payload"], "{\"card\": \"4111\"}");
}

#[tokio::test]
async fn a_dead_letter_replay_that_stops_is_409_with_what_moved() {
    // `gone` is no queue of the broker's: its messages cannot go back.
    let (_, broker, app) = dead_letter_router("gone", 2, false).await;
    let body = json!({"queue": "gone.dead"}).to_string();
    let reply = oneshot(
        &app,
        post("/admin/dead-letters/replay", Some(OPERATOR), &body),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    let outcome = reply.json();
    assert_eq!(outcome["replayed"], 0);
    assert!(
        outcome["error"].as_str().unwrap().contains("gone"),
        "{outcome}"
    );
    assert_eq!(broker.messages("gone.dead").len(), 2, "nothing lost");

    let skip = json!({"queue": "gone.dead", "skip_unreplayable": true}).to_string();
    let reply = oneshot(
        &app,
        post("/admin/dead-letters/replay", Some(OPERATOR), &skip),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["skipped"].as_array().unwrap().len(), 2);

    let purge = json!({"queue": "gone.dead", "dry_run": true}).to_string();
    let reply = oneshot(
        &app,
        post("/admin/dead-letters/purge", Some(OPERATOR), &purge),
    )
    .await;
    assert_eq!(reply.json()["depth"], 2);
    let purge = json!({"queue": "gone.dead"}).to_string();
    let reply = oneshot(
        &app,
        post("/admin/dead-letters/purge", Some(OPERATOR), &purge),
    )
    .await;
    assert_eq!(
        (
            reply.json()["purged"].clone(),
            reply.json()["marked"].clone()
        ),
        (json!(2), json!(2))
    );

    // A broker failing part way: 503, what moved counted, its text not
    // in the answer.
    let (_, broker, app) = dead_letter_router("orders", 3, false).await;
    let body = json!({"queue": "orders.dead"}).to_string();
    // Inspect and open pass, then the first message fails.
    broker.fail_after(2, 1);
    let reply = oneshot(
        &app,
        post("/admin/dead-letters/replay", Some(OPERATOR), &body),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let outcome = reply.json();
    assert_eq!(outcome["stopped_by"], "broker", "{outcome}");
    assert!(
        outcome["error"]
            .as_str()
            .unwrap()
            .contains("see the service's log"),
        "{outcome}"
    );
    assert!(!outcome["error"].as_str().unwrap().contains("injected"));
    assert_eq!(broker.messages("orders.dead").len(), 3, "nothing lost");
}

#[tokio::test]
async fn dead_letter_requests_that_make_no_sense_are_4xx() {
    let (_, _, served) = dead_letter_router("orders", 1, false).await;
    let cases = [
        (
            get("/admin/dead-letters/abc", Some(READER)),
            StatusCode::BAD_REQUEST,
            "invalid path",
        ),
        (
            get("/admin/dead-letters/99", Some(READER)),
            StatusCode::NOT_FOUND,
            "no dead letter",
        ),
        (
            get("/admin/dead-letters?limit=1001", Some(READER)),
            StatusCode::BAD_REQUEST,
            "limit",
        ),
        (
            get("/admin/dead-letters?bogus=1", Some(READER)),
            StatusCode::BAD_REQUEST,
            "known parameters",
        ),
        (
            post(
                "/admin/dead-letters/replay",
                Some(OPERATOR),
                r#"{"queue": "orders.dead", "bogus": 1}"#,
            ),
            StatusCode::BAD_REQUEST,
            "unknown field",
        ),
        (
            post(
                "/admin/dead-letters/replay",
                Some(OPERATOR),
                r#"{"queue": "nothing.dead"}"#,
            ),
            StatusCode::NOT_FOUND,
            "no queue",
        ),
        (
            post(
                "/admin/dead-letters/purge",
                Some(OPERATOR),
                r#"{"queue": "shared"}"#,
            ),
            StatusCode::BAD_REQUEST,
            "origins",
        ),
    ];
    for (request, status, needle) in cases {
        let uri = request.uri().clone();
        let reply = oneshot(&served, request).await;
        assert_eq!(
            reply.status,
            status,
            "{uri}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_error(&reply, status, needle);
    }

    // Without `.dead_letters(..)`, the endpoints say how to get them.
    let bare = app(router(&InMemoryStore::new()));
    let reply = oneshot(&bare, get("/admin/dead-letters", Some(READER))).await;
    assert_error(&reply, StatusCode::NOT_FOUND, ".dead_letters(");
}

#[tokio::test]
async fn malformed_requests_are_400_with_a_json_error() {
    let store = InMemoryStore::new();
    let app = app(router(&store));
    let op = Some(OPERATOR);
    for (path, body, needle) in [
        ("/admin/replay", "{not json", "invalid request body"),
        (
            "/admin/replay",
            "{\"dry_run\": true}",
            "missing field `filter`",
        ),
        (
            "/admin/replay",
            "{\"filter\": {\"statuss\": [\"dead\"]}}",
            "unknown field `statuss`",
        ),
        ("/admin/replay", "{\"filter\": {}}", "select the events"),
        (
            "/admin/replay",
            "{\"filter\": {\"statuses\": [\"sent\"]}}",
            "replay changes only dead events",
        ),
        ("/admin/skip", "{}", "skip takes either"),
        ("/admin/skip", "{\"id\": \"nope\"}", "invalid request body"),
        (
            "/admin/purge",
            "{\"target\": \"dead\", \"older_than_seconds\": 1}",
            "unknown variant `dead`",
        ),
    ] {
        let reply = oneshot(&app, post(path, op, body)).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, needle);
    }
    for (path, needle) in [
        ("/admin/events?status=dea", "dea"),
        ("/admin/events?limit=0", "limit must be between 1 and 10000"),
        (
            "/admin/events?colour=red",
            "unknown query parameter \"colour\"",
        ),
        (
            "/admin/failure-groups?after=3",
            "unknown query parameter \"after\"",
        ),
        ("/admin/events/not-a-uuid", "invalid path"),
        ("/admin/audit?before=x", "must be an integer"),
    ] {
        let reply = oneshot(&app, get(path, op)).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, needle);
    }
    let no_type = Request::post("/admin/replay")
        .header("authorization", format!("Bearer {OPERATOR}"))
        .body(Body::from(replay_body(Uuid::nil())))
        .unwrap();
    let reply = oneshot(&app, no_type).await;
    assert_error(&reply, StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type");
    // Also a POST without a body: a cross-site form or no-cors fetch cannot
    // pause a relay.
    let pause = Request::post("/admin/relays/r1/pause")
        .header("authorization", format!("Bearer {OPERATOR}"))
        .body(Body::empty())
        .unwrap();
    let reply = oneshot(&app, pause).await;
    assert_error(&reply, StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type");
    // An age before the calendar's start is refused, not read as "now".
    let reply = oneshot(
        &app,
        post(
            "/admin/purge",
            op,
            &json!({ "target": "inbox", "older_than_seconds": u64::MAX }).to_string(),
        ),
    )
    .await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "calendar");
}

#[tokio::test]
async fn unknown_ids_relays_and_routes_are_404() {
    let store = InMemoryStore::new();
    let app = app(router(&store));
    let missing = Uuid::now_v7();
    let reply = oneshot(&app, get(&format!("/admin/events/{missing}"), Some(READER))).await;
    assert_error(&reply, StatusCode::NOT_FOUND, &missing.to_string());
    let skip = json!({ "id": missing }).to_string();
    let reply = oneshot(&app, post("/admin/skip", Some(OPERATOR), &skip)).await;
    assert_error(&reply, StatusCode::NOT_FOUND, "no dead or retrying event");
    let reply = oneshot(&app, post("/admin/relays/nobody/pause", Some(OPERATOR), "")).await;
    assert_error(&reply, StatusCode::NOT_FOUND, "no relay named \"nobody\"");
    let reply = oneshot(&app, get("/admin/nothing", Some(READER))).await;
    assert_error(&reply, StatusCode::NOT_FOUND, "no admin endpoint");
    let reply = oneshot(&app, get("/admin/replay", Some(READER))).await;
    assert_error(&reply, StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
}

#[tokio::test]
async fn listings_filter_page_and_group() {
    let store = InMemoryStore::new();
    let ids: Vec<Uuid> = (0..3).map(|i| record(&store, &format!("a{i}"))).collect();
    kill(&store, &ids[..2]).await;
    let app = app(router(&store));

    let page = oneshot(&app, get("/admin/events?status=dead&limit=1", Some(READER)))
        .await
        .json();
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["items"][0]["id"], ids[0].to_string());
    let next = page["next"].as_i64().unwrap();
    let page = oneshot(
        &app,
        get(
            &format!("/admin/events?status=dead&status=retry&after={next}"),
            Some(READER),
        ),
    )
    .await
    .json();
    let rest: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(rest, [ids[1].to_string()]);
    assert!(
        page["items"][0].get("payload").is_none(),
        "listings carry no payload"
    );

    let groups = oneshot(
        &app,
        get(
            "/admin/failure-groups?event_type=thing.changed",
            Some(READER),
        ),
    )
    .await
    .json();
    assert_eq!(groups.as_array().unwrap().len(), 1, "{groups}");
    assert_eq!(groups[0]["dead"], 2, "{groups}");
}

#[tokio::test]
async fn skip_purge_and_relay_pause_through_http() {
    let store = InMemoryStore::new();
    let first = record(&store, "a");
    let second = record(&store, "a");
    kill(&store, &[first]).await;
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    let app = app(router(&store));

    let head = json!({ "aggregate_type": "thing", "aggregate_id": "a" }).to_string();
    let reply = oneshot(&app, post("/admin/skip", Some(OPERATOR), &head)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(store.get(first).unwrap().status, EventStatus::Skipped);
    let claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(claim.records()[0].id(), second, "released");
    claim.finish().await.unwrap();

    let purge = json!({ "target": "inbox", "older_than_seconds": 60, "dry_run": true });
    let reply = oneshot(
        &app,
        post("/admin/purge", Some(OPERATOR), &purge.to_string()),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["action"], "purge_inbox");

    let reply = oneshot(&app, post("/admin/relays/r1/pause", Some(OPERATOR), "")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let relays = oneshot(&app, get("/admin/relays", Some(READER)))
        .await
        .json();
    assert_eq!(relays[0]["paused"], true, "{relays}");
    oneshot(&app, post("/admin/relays/r1/resume", Some(OPERATOR), "")).await;
    let relays = oneshot(&app, get("/admin/relays", Some(READER)))
        .await
        .json();
    assert_eq!(relays[0]["paused"], false, "{relays}");

    let audit = oneshot(&app, get("/admin/audit?limit=2", Some(READER)))
        .await
        .json();
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["resume", "pause"], "newest first");
}

/// Puts the caller named by `x-user` (`ro:` prefix: read-only) into the
/// request, as a user's SSO layer would.
async fn sso(mut request: Request, next: Next) -> axum::response::Response {
    let user = request
        .headers()
        .get("x-user")
        .map(|v| v.to_str().unwrap().to_owned());
    if let Some(user) = user {
        let caller = match user.strip_prefix("ro:") {
            Some(name) => Caller::read_only(name),
            None => Caller::operator(user),
        };
        request.extensions_mut().insert(caller);
    }
    next.run(request).await
}

fn as_user(mut request: Request<Body>, user: &str) -> Request<Body> {
    request
        .headers_mut()
        .insert("x-user", user.parse().unwrap());
    request
}

#[tokio::test]
async fn a_caller_inserted_by_a_layer_is_honoured() {
    let store = InMemoryStore::new();
    let id = record(&store, "a");
    kill(&store, &[id]).await;
    let admin = AdminRouter::builder(Admin::new(store.clone()))
        .auth(LayerAuth)
        .build()
        .unwrap()
        .layer(middleware::from_fn(sso));
    let app = app(admin);

    let reply = oneshot(&app, get("/admin/status", None)).await;
    assert_error(&reply, StatusCode::UNAUTHORIZED, "not authenticated");
    let reply = oneshot(&app, as_user(get("/admin/status", None), "ro:bob")).await;
    assert_eq!(reply.status, StatusCode::OK);
    let replay = post("/admin/replay", None, &replay_body(id));
    let reply = oneshot(&app, as_user(replay, "ro:bob")).await;
    assert_error(&reply, StatusCode::FORBIDDEN, "bob may only read");

    let replay = post("/admin/replay", None, &replay_body(id));
    let reply = oneshot(&app, as_user(replay, "sso:carol")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(store.get(id).unwrap().status, EventStatus::Pending);
    let audit = oneshot(&app, as_user(get("/admin/audit", None), "ro:bob"))
        .await
        .json();
    assert_eq!(audit[0]["identity"], "sso:carol");

    // The layer's caller wins over a bearer token, too.
    let both = AdminRouter::builder(Admin::new(store.clone()))
        .auth(tokens())
        .build()
        .unwrap()
        .layer(middleware::from_fn(sso));
    let replay = post("/admin/replay", Some(OPERATOR), &replay_body(id));
    let reply = oneshot(
        &Router::new().nest("/admin", both),
        as_user(replay, "ro:bob"),
    )
    .await;
    assert_error(&reply, StatusCode::FORBIDDEN, "bob may only read");
}

#[tokio::test]
async fn anonymous_is_an_operator_named_anonymous() {
    let store = InMemoryStore::new();
    let id = record(&store, "a");
    kill(&store, &[id]).await;
    let admin = AdminRouter::builder(Admin::new(store.clone()))
        .allow_anonymous()
        .build()
        .unwrap();
    let app = app(admin);
    let reply = oneshot(&app, post("/admin/replay", None, &replay_body(id))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let audit = oneshot(&app, get("/admin/audit", None)).await.json();
    assert_eq!(audit[0]["identity"], "anonymous");
}

#[test]
fn it_refuses_to_build_without_a_choice_of_authentication_or_with_weak_tokens() {
    let refused = |builder: outbox_axum::admin::AdminRouterBuilder<InMemoryStore>, needle: &str| {
        let err = builder.build().err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains(needle)),
            "{err:?} should contain {needle:?}"
        );
    };
    let builder = || AdminRouter::builder(Admin::new(InMemoryStore::new()));
    refused(builder(), "no authentication");
    refused(builder().auth(tokens()).allow_anonymous(), "choose one");
    refused(
        builder().auth(BearerTokens::new().operator("admin", "changeme")),
        "fewer than 16",
    );
    refused(
        builder().auth(BearerTokens::new().operator("admin", "")),
        "is empty",
    );
    refused(builder().auth(BearerTokens::new()), "no token");
}

// --- against PostgreSQL -----------------------------------------------------

mod postgres {
    use common::{OrderPlaced, TestDb, client, send, serve};
    use diesel_async::AsyncConnection as _;
    use outbox_diesel::PgOutboxStore;

    use super::*;

    /// Two events of order 1, both claimed in one batch and marked dead.
    async fn two_dead(db: &TestDb, store: &PgOutboxStore) -> [Uuid; 2] {
        let events = ["first", "second"].map(|name| OrderPlaced {
            order_id: 1,
            name: name.into(),
        });
        let ids: [Uuid; 2] = db
            .conn()
            .await
            .transaction::<_, outbox_diesel::Error, _>(async |conn| {
                db.outbox.record_all(conn, &events).await
            })
            .await
            .unwrap()
            .try_into()
            .unwrap();
        fail_claimed(store, &ids, 5, NextStep::Dead, |_| NO_EXCHANGE.into())
            .await
            .unwrap();
        ids
    }

    #[tokio::test]
    async fn an_http_replay_keeps_order_and_audits_the_token_identity() {
        let db = TestDb::new("admin_replay").await;
        let store = PgOutboxStore::builder(db.pool.clone())
            .schema(&db.schema)
            .build()
            .unwrap();
        let [first, second] = two_dead(&db, &store).await;
        assert!(store.claim(10).await.unwrap().is_none(), "both dead");
        let admin = AdminRouter::builder(Admin::new(store.clone()))
            .auth(tokens())
            .build()
            .unwrap();
        let addr = serve(app(admin)).await;
        let http = client();

        let dead = send(&http, addr, get("/admin/events?status=dead", Some(READER)))
            .await
            .unwrap();
        assert_eq!(dead.status, StatusCode::OK);
        let listed: Vec<String> = dead.json()["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(listed, [first.to_string(), second.to_string()]);

        // A read-only token may not replay; nothing changes.
        let reply = send(
            &http,
            addr,
            post("/admin/replay", Some(READER), &replay_body(first)),
        )
        .await
        .unwrap();
        assert_error(&reply, StatusCode::FORBIDDEN, "grafana may only read");

        // The later one alone: it stays held behind the earlier dead one.
        let reply = send(
            &http,
            addr,
            post("/admin/replay", Some(OPERATOR), &replay_body(second)),
        )
        .await
        .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(
            (
                reply.json()["matched"].as_u64(),
                reply.json()["changed"].as_u64()
            ),
            (Some(1), Some(1))
        );
        assert!(
            store.claim(10).await.unwrap().is_none(),
            "the replayed later event is held while the earlier one is dead"
        );

        // Then the earlier one: a claim returns both, in order.
        let reply = send(
            &http,
            addr,
            post("/admin/replay", Some(OPERATOR), &replay_body(first)),
        )
        .await
        .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        let claim = store.claim(10).await.unwrap().expect("claimable again");
        let ids: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
        assert_eq!(ids, [first, second], "replayed events keep their order");
        claim.finish().await.unwrap();

        let audit = send(&http, addr, get("/admin/audit", Some(READER)))
            .await
            .unwrap()
            .json();
        let rows = audit.as_array().unwrap();
        assert_eq!(rows.len(), 2, "{audit}");
        for row in rows {
            assert_eq!(row["identity"], "alice", "{row}");
            assert_eq!(row["action"], "replay", "{row}");
            assert_eq!(row["count"], 1, "{row}");
        }
    }
}
