//! The layer on MariaDB and SQLite (features `mysql` and `sqlite`): a
//! handler's `Tx<C>` of that back end commits its change and its events
//! together or neither; a `Tx` of another connection type is a clear 500.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use http::{Request, StatusCode};
use outbox_axum::{Events, OutboxLayer, Tx};
use outbox_core::testing::TestEvent;
use outbox_diesel::mysql;
use outbox_diesel::sqlite::{self, AsyncSqliteConnection};
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names::unique;
use outbox_testkit::urls::mysql_url;
use tower::ServiceExt as _;

async fn call(app: &Router, path: &str) -> (StatusCode, String) {
    let response = app
        .clone()
        .oneshot(Request::post(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn mysql_ok(mut tx: Tx<AsyncMysqlConnection>, events: Events) -> StatusCode {
    diesel::sql_query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    events.raise(TestEvent::new("o-1")).unwrap();
    StatusCode::CREATED
}

async fn mysql_fail(mut tx: Tx<AsyncMysqlConnection>, events: Events) -> StatusCode {
    diesel::sql_query("INSERT INTO orders (id) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    events.raise(TestEvent::new("o-2")).unwrap();
    StatusCode::UNPROCESSABLE_ENTITY
}

/// The default `Tx` is PostgreSQL's: with a MariaDB pool, a clear 500.
async fn wrong(_tx: Tx) -> StatusCode {
    StatusCode::OK
}

#[tokio::test]
async fn a_mariadb_request_commits_its_change_and_events_together() {
    let db = TestMysqlDatabase::create(&mysql_url(), unique("axm", "layer")).await;
    let mut conn = mysql::connect(db.url()).await.unwrap();
    mysql::migrate(&mut conn).await.unwrap();
    conn.batch_execute("CREATE TABLE orders (id INT PRIMARY KEY)")
        .await
        .unwrap();
    let app = Router::new()
        .route("/ok", post(mysql_ok))
        .route("/fail", post(mysql_fail))
        .route("/wrong", post(wrong))
        .layer(OutboxLayer::new(mysql::pool(db.url(), 2).unwrap()));

    assert_eq!(call(&app, "/ok").await.0, StatusCode::CREATED);
    assert_eq!(
        call(&app, "/fail").await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let (status, body) = call(&app, "/wrong").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("AsyncMysqlConnection"), "{body}");

    let count = |sql: &'static str| {
        let url = db.url().to_owned();
        async move {
            let mut conn = mysql::connect(&url).await.unwrap();
            outbox_testkit::mysql::count(&mut conn, sql).await
        }
    };
    assert_eq!(count("SELECT COUNT(*) AS n FROM orders").await, 1);
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM outbox_events WHERE aggregate_id = 'o-1'").await,
        1
    );
    assert_eq!(count("SELECT COUNT(*) AS n FROM outbox_events").await, 1);
}

async fn sqlite_ok(mut tx: Tx<AsyncSqliteConnection>, events: Events) -> StatusCode {
    diesel::sql_query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    events.raise(TestEvent::new("o-1")).unwrap();
    StatusCode::CREATED
}

async fn sqlite_fail(mut tx: Tx<AsyncSqliteConnection>, events: Events) -> StatusCode {
    diesel::sql_query("INSERT INTO orders (id) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    events.raise(TestEvent::new("o-2")).unwrap();
    StatusCode::UNPROCESSABLE_ENTITY
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sqlite_request_commits_its_change_and_events_together() {
    let dir = std::env::temp_dir().join(unique("axs", "layer"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("app.db").display());
    let mut conn = sqlite::connect(&url).await.unwrap();
    sqlite::migrate(&mut conn).await.unwrap();
    conn.batch_execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .await
        .unwrap();
    let app = Router::new()
        .route("/ok", post(sqlite_ok))
        .route("/fail", post(sqlite_fail))
        .route("/wrong", post(wrong))
        .layer(OutboxLayer::new(sqlite::pool(&url, 2).unwrap()));

    assert_eq!(call(&app, "/ok").await.0, StatusCode::CREATED);
    assert_eq!(
        call(&app, "/fail").await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        call(&app, "/wrong").await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );

    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let count = |sql: &'static str| {
        let url = url.clone();
        async move {
            let mut conn = sqlite::connect(&url).await.unwrap();
            diesel::sql_query(sql)
                .get_result::<N>(&mut conn)
                .await
                .unwrap()
                .n
        }
    };
    assert_eq!(count("SELECT count(*) AS n FROM orders").await, 1);
    assert_eq!(count("SELECT count(*) AS n FROM outbox_events").await, 1);
    drop(conn);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recorder of another back end than the pool's is refused when the
/// router is built, not at the first request with events.
#[test]
#[should_panic(expected = "record with a outbox_diesel::mysql::record::MysqlOutbox")]
fn a_recorder_of_another_back_end_is_refused_at_build_time() {
    let pool = mysql::pool("mysql://outbox:outbox@127.0.0.1:3306/none", 1).unwrap();
    let _ = OutboxLayer::new(pool).outbox(outbox_diesel::Outbox::default());
}

async fn sqlite_swallowed(mut tx: Tx<AsyncSqliteConnection>, events: Events) -> StatusCode {
    diesel::sql_query("INSERT INTO orders (id) VALUES (3)")
        .execute(&mut *tx)
        .await
        .unwrap();
    // Rolls the whole transaction back; the handler carries on.
    let _ = diesel::sql_query("INSERT INTO doomed (v) VALUES (1)")
        .execute(&mut *tx)
        .await;
    events.raise(TestEvent::new("o-3")).unwrap();
    StatusCode::CREATED
}

async fn sqlite_flush(mut tx: Tx<AsyncSqliteConnection>, events: Events) -> StatusCode {
    events.raise(TestEvent::new("o-4")).unwrap();
    assert_eq!(events.flush(&mut tx).await.unwrap(), 1);
    StatusCode::CREATED
}

/// A transaction SQLite rolled back under a handler that went on: the
/// request fails (500) and its event is not stored on its own; a handler
/// that flushes its events itself writes them in its `Tx`.
#[tokio::test(flavor = "multi_thread")]
async fn a_sqlite_transaction_lost_under_the_handler_fails_the_request() {
    let dir = std::env::temp_dir().join(unique("axs", "lost"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("app.db").display());
    let mut conn = sqlite::connect(&url).await.unwrap();
    sqlite::migrate(&mut conn).await.unwrap();
    conn.batch_execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY); CREATE TABLE doomed (v INTEGER); \
         CREATE TRIGGER doomed_rolls_back BEFORE INSERT ON doomed \
         BEGIN SELECT RAISE(ROLLBACK, 'rolled back'); END",
    )
    .await
    .unwrap();
    let app = Router::new()
        .route("/swallowed", post(sqlite_swallowed))
        .route("/flush", post(sqlite_flush))
        .layer(OutboxLayer::new(sqlite::pool(&url, 2).unwrap()));
    assert_eq!(
        call(&app, "/swallowed").await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(call(&app, "/flush").await.0, StatusCode::CREATED);

    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Text)]
        aggregate_id: String,
    }
    let ids: Vec<Id> = diesel::sql_query("SELECT aggregate_id FROM outbox_events ORDER BY seq")
        .load(&mut conn)
        .await
        .unwrap();
    let ids: Vec<String> = ids.into_iter().map(|i| i.aggregate_id).collect();
    assert_eq!(ids, ["o-4"], "the lost request's event is not stored");
    drop(conn);
    let _ = std::fs::remove_dir_all(&dir);
}
