//! Shared harness: a PostgreSQL schema per test (outbox tables + a business
//! table; the [`TestDb`] of outbox-diesel's tests, shared), the test
//! application's routes, and HTTP helpers for `oneshot`
//! and for a real server on 127.0.0.1:0.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection as _, AsyncPgConnection, RunQueryDsl};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outbox_axum::{Events, Tx};
use outbox_core::DomainEvent;
use outbox_testkit::eventually::eventually;
use outbox_testkit::names;
use outbox_testkit::pg::{self, backend_pid};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tower::ServiceExt as _;

#[allow(unused_imports)]
pub use outbox_testkit::urls::{DEFAULT_DATABASE_URL as DEFAULT_URL, database_url};

#[path = "../../../outbox-diesel/tests/common/db.rs"]
mod db;

pub use db::TestDb;

/// A migrated outbox schema with an `orders` table, dropped when the test
/// ends (also when it panics).
impl TestDb {
    pub async fn new(test: &str) -> TestDb {
        TestDb::with_pool(test, 6).await
    }

    pub async fn with_pool(test: &str, pool_size: usize) -> TestDb {
        let db = TestDb::reserve(names::unique("ax", test), pool_size);
        db.migrate().await;
        // `parent` fails at COMMIT when it names no order: the injected
        // commit failure.
        TestDb::execute(
            &db,
            "CREATE TABLE {schema}.orders (
                 id bigserial PRIMARY KEY,
                 name text NOT NULL,
                 parent bigint REFERENCES {schema}.orders (id) DEFERRABLE INITIALLY DEFERRED
             )",
        );
        db
    }

    /// `SELECT count(*) FROM <schema>.<table>`.
    pub async fn count(&self, table: &str) -> i64 {
        pg::count(
            &mut self.conn().await,
            &self.sql(&format!("SELECT count(*) AS n FROM {{schema}}.{table}")),
        )
        .await
    }

    /// `(orders, outbox events)`.
    pub async fn counts(&self) -> (i64, i64) {
        (
            self.count("orders").await,
            self.count("outbox_events").await,
        )
    }

    pub async fn order_ids(&self) -> Vec<i64> {
        #[derive(QueryableByName)]
        struct Id {
            #[diesel(sql_type = BigInt)]
            id: i64,
        }
        diesel::sql_query(format!(
            "SELECT id FROM \"{}\".orders ORDER BY id",
            self.schema
        ))
        .load::<Id>(&mut self.conn().await)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect()
    }

    /// The stored events, in `seq` order.
    pub async fn events(&self) -> Vec<StoredEvent> {
        diesel::sql_query(format!(
            "SELECT aggregate_id, event_type, headers::text AS headers \
             FROM \"{}\".outbox_events ORDER BY seq",
            self.schema
        ))
        .load::<StoredEvent>(&mut self.conn().await)
        .await
        .unwrap()
    }

    /// Sessions left `idle in transaction` after touching this schema: a
    /// pooled connection stuck inside `BEGIN` would show up here.
    pub async fn idle_in_transaction(&self) -> i64 {
        pg::count(
            &mut self.conn().await,
            &format!(
                "SELECT count(*) AS n FROM pg_stat_activity \
                 WHERE state LIKE 'idle in transaction%' AND query LIKE '%{}%' \
                 AND pid <> pg_backend_pid()",
                self.schema
            ),
        )
        .await
    }

    /// Waits (up to 5 s) until backend `pid` is gone: its connection was
    /// closed, not pooled.
    pub async fn assert_backend_closed(&self, pid: i32) {
        let sql = format!("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = {pid}");
        eventually(format!(
            "backend {pid} gone (its connection must not go back to the pool)"
        ))
        .within(Duration::from_secs(5))
        .equals(0, || async {
            pg::count(&mut self.conn().await, &sql).await
        })
        .await;
    }

    /// Waits (up to 5 s) until no session is left inside a transaction.
    pub async fn assert_no_open_transaction(&self) {
        eventually(format!(
            "no session left idle in transaction on {}",
            self.schema
        ))
        .within(Duration::from_secs(5))
        .equals(0, || self.idle_in_transaction())
        .await;
    }
}

#[derive(Debug, QueryableByName)]
pub struct StoredEvent {
    #[diesel(sql_type = Text)]
    pub aggregate_id: String,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    #[diesel(sql_type = Text)]
    pub headers: String,
}

impl StoredEvent {
    pub fn header(&self, key: &str) -> Option<String> {
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&self.headers).unwrap();
        map.get(key).map(|v| v.as_str().unwrap().to_owned())
    }
}

// --- the application under test ---------------------------------------------

#[derive(Debug, Serialize)]
pub struct OrderPlaced {
    pub order_id: i64,
    pub name: String,
}

impl DomainEvent for OrderPlaced {
    fn aggregate_type(&self) -> &'static str {
        "order"
    }
    fn event_type(&self) -> &'static str {
        "order.placed"
    }
    fn aggregate_id(&self) -> String {
        self.order_id.to_string()
    }
}

/// What a test asks the handler to do.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Cmd {
    pub name: String,
    /// Status to answer with (default 201).
    pub status: Option<u16>,
    pub panic: bool,
    /// An order id that must exist at COMMIT (the deferred FK).
    pub parent: Option<i64>,
    /// Roll the user-managed transaction back (`/own-tx`).
    pub rollback: bool,
    /// Sleep this long after the insert (for timeout layers).
    pub sleep_ms: u64,
    /// Raise `order.placed` (`/nested-cancelled`, `/swallowed-error`).
    pub raise: bool,
}

impl Cmd {
    pub fn named(name: &str) -> Cmd {
        Cmd {
            name: name.into(),
            ..Cmd::default()
        }
    }

    pub fn status(mut self, status: u16) -> Cmd {
        self.status = Some(status);
        self
    }
}

/// Holds `/hold` handlers until released, and tells when they are dropped;
/// `backend` is the PostgreSQL backend pid of the last misbehaving
/// handler's transaction.
#[derive(Default)]
pub struct Gate {
    pub entered: Notify,
    pub release: Notify,
    pub dropped: Notify,
    pub backend: std::sync::Mutex<Option<i32>>,
}

struct DropSignal(Arc<Gate>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.dropped.notify_one();
    }
}

#[derive(Clone)]
pub struct AppState {
    pub schema: String,
    pub pool: Pool<AsyncPgConnection>,
    pub gate: Arc<Gate>,
}

pub async fn insert_order(
    conn: &mut AsyncPgConnection,
    schema: &str,
    name: &str,
    parent: Option<i64>,
) -> i64 {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    diesel::sql_query(format!(
        "INSERT INTO \"{schema}\".orders (name, parent) VALUES ($1, $2) RETURNING id"
    ))
    .bind::<Text, _>(name)
    .bind::<Nullable<BigInt>, _>(parent)
    .get_result::<Id>(conn)
    .await
    .unwrap()
    .id
}

fn status_of(cmd: &Cmd) -> StatusCode {
    StatusCode::from_u16(cmd.status.unwrap_or(201)).unwrap()
}

/// `Tx` + `Events`: insert an order, raise `order.placed`, answer as asked.
async fn place_order(
    State(app): State<AppState>,
    mut tx: Tx,
    events: Events,
    Json(cmd): Json<Cmd>,
) -> (StatusCode, Json<serde_json::Value>) {
    let id = insert_order(&mut tx, &app.schema, &cmd.name, cmd.parent).await;
    raise_placed(&events, id, &cmd.name);
    if cmd.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(cmd.sleep_ms)).await;
    }
    if cmd.panic {
        panic!("handler panicked on purpose");
    }
    (status_of(&cmd), Json(serde_json::json!({ "id": id })))
}

/// Domain code that knows nothing about HTTP: raises through the task-local.
mod domain {
    use super::*;

    pub async fn place(conn: &mut AsyncPgConnection, schema: &str, name: &str) -> i64 {
        let id = insert_order(conn, schema, name, None).await;
        announce(id, name).unwrap();
        id
    }

    fn announce(order_id: i64, name: &str) -> Result<(), outbox_axum::Error> {
        outbox_axum::raise(OrderPlaced {
            order_id,
            name: name.to_owned(),
        })
    }
}

/// Raises from nested code, from a task spawned with the scope carried, and
/// reports what a task spawned without it got.
async fn place_nested(
    State(app): State<AppState>,
    mut tx: Tx,
    Json(cmd): Json<Cmd>,
) -> (StatusCode, Json<serde_json::Value>) {
    let id = domain::place(&mut tx, &app.schema, &cmd.name).await;
    let carried = Events::current().unwrap();
    let follow_up = cmd.name.clone();
    tokio::spawn(carried.scope(async move {
        outbox_axum::raise(OrderPlaced {
            order_id: id,
            name: format!("{follow_up} (from a spawned task)"),
        })
    }))
    .await
    .unwrap()
    .unwrap();
    let unscoped = tokio::spawn(async move {
        outbox_axum::raise(OrderPlaced {
            order_id: id,
            name: "lost".into(),
        })
    })
    .await
    .unwrap();
    (
        status_of(&cmd),
        Json(serde_json::json!({ "id": id, "unscoped": unscoped.unwrap_err().to_string() })),
    )
}

/// Only `Events`, no transaction.
async fn events_only(events: Events, Json(cmd): Json<Cmd>) -> StatusCode {
    raise_placed(&events, 0, &cmd.name);
    status_of(&cmd)
}

/// A user-managed transaction with `events.flush`.
async fn own_tx(
    State(app): State<AppState>,
    events: Events,
    Json(cmd): Json<Cmd>,
) -> (StatusCode, String) {
    let mut conn = app.pool.get().await.unwrap();
    let result = conn
        .transaction::<_, diesel::result::Error, _>(async |conn| {
            let id = insert_order(conn, &app.schema, &cmd.name, None).await;
            raise_placed(&events, id, &cmd.name);
            let written = events.flush(conn).await.unwrap();
            assert_eq!(written, 1);
            assert!(events.is_empty());
            if cmd.rollback {
                Err(diesel::result::Error::RollbackTransaction)
            } else {
                Ok(id)
            }
        })
        .await;
    (status_of(&cmd), format!("{result:?}"))
}

/// Extracts `Tx` twice.
async fn tx_twice(_first: Tx, _second: Tx) -> StatusCode {
    StatusCode::CREATED
}

/// Holds inside the transaction until the gate is released.
async fn hold(
    State(app): State<AppState>,
    mut tx: Tx,
    events: Events,
    Json(cmd): Json<Cmd>,
) -> StatusCode {
    let _signal = DropSignal(Arc::clone(&app.gate));
    let id = insert_order(&mut tx, &app.schema, &cmd.name, None).await;
    raise_placed(&events, id, &cmd.name);
    let released = app.gate.release.notified();
    app.gate.entered.notify_one();
    released.await;
    status_of(&cmd)
}

/// Raises `order.placed` for order `order_id`.
fn raise_placed(events: &Events, order_id: i64, name: &str) {
    events
        .raise(OrderPlaced {
            order_id,
            name: name.to_owned(),
        })
        .unwrap();
}

/// How a misbehaving handler starts: notes its transaction's backend pid
/// in the gate, inserts an order and raises its event if asked; the
/// order's id.
async fn misbehaving_start(app: &AppState, tx: &mut Tx, events: &Events, cmd: &Cmd) -> i64 {
    *app.gate.backend.lock().unwrap() = Some(backend_pid(tx).await);
    let id = insert_order(tx, &app.schema, &cmd.name, None).await;
    if cmd.raise {
        raise_placed(events, id, &cmd.name);
    }
    id
}

/// Inserts an order (and raises its event if asked), then runs a nested
/// transaction (a savepoint) whose future a timeout cancels mid-way, and
/// answers success anyway.
async fn nested_cancelled(
    State(app): State<AppState>,
    mut tx: Tx,
    events: Events,
    Json(cmd): Json<Cmd>,
) -> (StatusCode, Json<serde_json::Value>) {
    let id = misbehaving_start(&app, &mut tx, &events, &cmd).await;
    let schema = app.schema.clone();
    let nested = tokio::time::timeout(
        Duration::from_millis(200),
        tx.transaction::<_, diesel::result::Error, _>(async move |conn| {
            insert_order(conn, &schema, "nested", None).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }),
    )
    .await;
    assert!(nested.is_err(), "the nested transaction was cancelled");
    (status_of(&cmd), Json(serde_json::json!({ "id": id })))
}

/// Inserts an order (and raises its event if asked), then runs a statement
/// that fails, ignores the error and answers success anyway.
async fn swallowed_error(
    State(app): State<AppState>,
    mut tx: Tx,
    events: Events,
    Json(cmd): Json<Cmd>,
) -> (StatusCode, Json<serde_json::Value>) {
    let id = misbehaving_start(&app, &mut tx, &events, &cmd).await;
    let failed = diesel::sql_query("SELECT 1 / 0").execute(&mut tx).await;
    assert!(failed.is_err(), "division by zero fails");
    (status_of(&cmd), Json(serde_json::json!({ "id": id })))
}

/// No extractor of this crate: must work even when the database is down.
async fn health() -> &'static str {
    "ok"
}

/// The test routes, without the layer.
pub fn routes(db: &TestDb) -> (Router, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let state = AppState {
        schema: db.schema.clone(),
        pool: db.pool.clone(),
        gate: Arc::clone(&gate),
    };
    let router = Router::new()
        .route("/orders", post(place_order))
        .route("/nested", post(place_nested))
        .route("/events-only", post(events_only))
        .route("/own-tx", post(own_tx))
        .route("/twice", post(tx_twice))
        .route("/hold", post(hold))
        .route("/nested-cancelled", post(nested_cancelled))
        .route("/swallowed-error", post(swallowed_error))
        .route("/health", post(health))
        .with_state(state);
    (router, gate)
}

// --- HTTP ---------------------------------------------------------------------

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The `id` of a created order.
    pub fn id(&self) -> i64 {
        self.json()["id"].as_i64().unwrap()
    }

    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap().to_owned()
    }
}

pub fn request(path: &str, cmd: &Cmd) -> Request<Body> {
    request_with(path, cmd, &[])
}

pub fn request_with(path: &str, cmd: &Cmd, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::post(path).header("content-type", "application/json");
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    builder
        .body(Body::from(serde_json::to_vec(cmd).unwrap()))
        .unwrap()
}

/// One request through `tower::ServiceExt::oneshot`.
pub async fn oneshot(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// A real server on 127.0.0.1:0, stopped when the test's runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One request over TCP.
pub async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    request: Request<Body>,
) -> Result<Reply, hyper_util::client::legacy::Error> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let mut request = Request::from_parts(parts, Full::new(body));
    *request.uri_mut() = format!("http://{addr}{}", request.uri()).parse().unwrap();
    let response = client.request(request).await?;
    let (parts, body) = response.into_parts();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    })
}

/// Fails the test instead of hanging.
pub async fn within<F: std::future::Future>(secs: u64, what: &str, future: F) -> F::Output {
    outbox_testkit::eventually::within(Duration::from_secs(secs), what, future).await
}
