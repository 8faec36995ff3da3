//! The relay's `LISTEN` connection: a committed event wakes the relay through
//! `NOTIFY` (polling is an hour here), and after the listener session is
//! killed it reconnects and rescans the backlog, so an event whose `NOTIFY`
//! was lost meanwhile is still published promptly. The store's wakeup
//! stream owns its connection: dropping it (as a stopping relay does) ends
//! the listener session.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{TestDb, moved};
use diesel::{PgConnection, RunQueryDsl as _};
use diesel_async::{AsyncConnection as _, AsyncPgConnection};
use futures_util::{Stream, StreamExt as _};
use outbox_core::testing::{RecordingPublisher, wakeup_driven};
use outbox_core::{OutboxStore as _, RelayHandle};
use outbox_diesel::{Error, PgOutboxStore};
use outbox_testkit::eventually::eventually;
use outbox_testkit::pg;
use tokio::task::JoinHandle;
use uuid::Uuid;

const PUBLISH_BOUND: Duration = Duration::from_secs(5);

/// The store of `db` with a `LISTEN` connection.
fn listening_store(db: &TestDb) -> PgOutboxStore {
    PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .listen(&db.url)
        .build()
        .unwrap()
}

/// A relay with a `LISTEN` connection and hour-long polling, running.
fn start_relay(db: &TestDb) -> (RelayHandle, RecordingPublisher, JoinHandle<()>) {
    let store = listening_store(db);
    let publisher = RecordingPublisher::new();
    let relay = wakeup_driven(store, publisher.clone()).build().unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    (handle, publisher, task)
}

async fn stop_relay(handle: RelayHandle, task: JoinHandle<()>) {
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the relay stops after shutdown")
        .unwrap();
}

/// Records one event in a committed transaction, without `handle.notify()`.
async fn record(db: &TestDb, conn: &mut AsyncPgConnection, n: u32) -> Uuid {
    conn.transaction::<_, Error, _>(async |conn| db.outbox.record(conn, &moved("l", n)).await)
        .await
        .unwrap()
}

/// Records `events` events one after the other, each once the previous
/// one was published, and checks that each is published within
/// [`PUBLISH_BOUND`] (without `handle.notify()`).
async fn record_each_and_see_it_published(
    db: &TestDb,
    publisher: &RecordingPublisher,
    events: u32,
) {
    let mut conn = db.conn().await;
    for n in 1..=events {
        let id = record(db, &mut conn, n).await;
        tokio::time::timeout(PUBLISH_BOUND, publisher.wait_for(n as usize))
            .await
            .unwrap_or_else(|_| panic!("event {n} was not published within {PUBLISH_BOUND:?}"));
        assert_eq!(publisher.published_ids().last(), Some(&id));
    }
}

#[derive(Debug, diesel::QueryableByName)]
struct Session {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    state: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    query: Option<String>,
}

/// The sessions named after this schema's listener.
fn listener_sessions(db: &TestDb) -> Vec<Session> {
    listener_sessions_on(&mut db.sync_conn(), &db.schema)
}

fn listener_sessions_on(conn: &mut PgConnection, schema: &str) -> Vec<Session> {
    diesel::sql_query("SELECT pid, state, query FROM pg_stat_activity WHERE application_name = $1")
        .bind::<diesel::sql_types::Text, _>(format!("outbox_listener:{schema}"))
        .load(conn)
        .unwrap()
}

/// Waits until a listener session other than `not` has run its `LISTEN`
/// and sits idle; returns its pid.
async fn wait_for_listener(db: &TestDb, not: Option<i32>) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = listener_sessions(db).into_iter().find(|s| {
            Some(s.pid) != not
                && s.state.as_deref() == Some("idle")
                && s.query.as_deref().is_some_and(|q| q.starts_with("LISTEN"))
        });
        if let Some(session) = ready {
            return session.pid;
        }
        assert!(
            Instant::now() < deadline,
            "no listener session: {:?}",
            listener_sessions(db)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn committed_event_wakes_the_relay_through_notify() {
    let db = TestDb::new("listen_notify").await;
    let (handle, publisher, task) = start_relay(&db);
    wait_for_listener(&db, None).await;

    // One after the other: the listener's one wakeup on connect can explain
    // at most the first; the others need their NOTIFY (polling is an hour).
    record_each_and_see_it_published(&db, &publisher, 3).await;
    assert_eq!(publisher.published_ids().len(), 3, "each event once");
    stop_relay(handle, task).await;
    assert_eq!(db.count("outbox_events", "WHERE status = 'sent'"), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_notification_is_recovered_by_the_rescan_after_reconnect() {
    let db = TestDb::new("listen_reconnect").await;
    let (handle, publisher, task) = start_relay(&db);
    let pid = wait_for_listener(&db, None).await;
    let mut conn = db.conn().await;

    // Warm up, then let any wakeup still queued be consumed, so that only
    // the reconnect can publish the next event.
    let warm_up = record(&db, &mut conn, 1).await;
    tokio::time::timeout(PUBLISH_BOUND, publisher.wait_for(1))
        .await
        .expect("the warm-up event is published");
    assert_eq!(publisher.published_ids(), vec![warm_up]);
    tokio::time::sleep(Duration::from_millis(300)).await;

    #[derive(diesel::QueryableByName)]
    struct Terminated {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        ok: bool,
    }
    let mut monitor = db.sync_conn();
    // The commit must land while nobody listens (before the listener's
    // >= 100 ms reconnect backoff ends). On a loaded machine it may not: then
    // that round proves nothing, its event is published anyway, and we retry.
    let mut pid = pid;
    let mut published = vec![warm_up];
    let mut proven = false;
    for round in 0..5u32 {
        let terminated: Terminated = diesel::sql_query("SELECT pg_terminate_backend($1) AS ok")
            .bind::<diesel::sql_types::Integer, _>(pid)
            .get_result(&mut monitor)
            .unwrap();
        assert!(terminated.ok, "the listener session was terminated");
        let deadline = Instant::now() + Duration::from_secs(1);
        while listener_sessions_on(&mut monitor, &db.schema)
            .iter()
            .any(|s| s.pid == pid)
        {
            assert!(
                Instant::now() < deadline,
                "the listener session did not end"
            );
        }
        let event = record(&db, &mut conn, 2 + round).await;
        let nobody_listened = listener_sessions_on(&mut monitor, &db.schema).is_empty();
        published.push(event);
        tokio::time::timeout(PUBLISH_BOUND, publisher.wait_for(published.len()))
            .await
            .expect("the event recorded around the reconnect is published");
        assert_eq!(publisher.published_ids(), published);
        let new_pid = wait_for_listener(&db, Some(pid)).await;
        assert_ne!(new_pid, pid);
        pid = new_pid;
        if nobody_listened {
            proven = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        proven,
        "in 5 rounds no commit landed while the listener was away; the machine is too loaded to prove the rescan"
    );

    // The new session delivers notifications again.
    let next = record(&db, &mut conn, 100).await;
    tokio::time::timeout(PUBLISH_BOUND, publisher.wait_for(published.len() + 1))
        .await
        .expect("published through the new LISTEN session");
    assert_eq!(publisher.published_ids().last(), Some(&next));

    stop_relay(handle, task).await;
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'sent'"),
        published.len() as i64 + 1
    );
}

/// A schema name of 63 bytes, the most PostgreSQL takes: its channel
/// `outbox_events.<schema>` would be 77 bytes, which `pg_notify` refuses (so
/// every `record` failed) and `LISTEN` truncates. Recording works and each
/// commit wakes the relay through its `LISTEN`.
#[tokio::test(flavor = "multi_thread")]
async fn longest_schema_name_records_and_wakes_the_relay() {
    let db = TestDb::new_long("listen_long").await;
    assert_eq!(db.schema.len(), 63);
    let (handle, publisher, task) = start_relay(&db);
    // The listener's application name is truncated for such a schema: find
    // it by its LISTEN statement instead.
    let listen = format!("LISTEN {}", db.outbox.schema().quoted_channel());
    let query = format!(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'idle' AND query = '{}'",
        listen.replace('\'', "''")
    );
    eventually(format!("a session ran {listen}"))
        .every(Duration::from_millis(10))
        .equals(1, || {
            std::future::ready(pg::count_sync(&mut db.sync_conn(), &query))
        })
        .await;

    record_each_and_see_it_published(&db, &publisher, 3).await;
    stop_relay(handle, task).await;
    assert_eq!(db.count("outbox_events", "WHERE status = 'sent'"), 3);
    let channel = db.outbox.schema().channel();
    assert!(channel.len() <= 63, "{channel}");
}

/// How many listener sessions of this schema there are (any state).
fn listener_count(db: &TestDb) -> i64 {
    pg::count_sync(
        &mut db.sync_conn(),
        &format!(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'outbox_listener:{}'",
            db.schema
        ),
    )
}

/// Waits up to `bound` for the next item of `wakeups`, which must not end.
async fn next_wakeup(wakeups: &mut (impl Stream<Item = ()> + Unpin), bound: Duration, what: &str) {
    tokio::time::timeout(bound, wakeups.next())
        .await
        .expect(what)
        .expect("the stream does not end");
}

/// Waits until no listener session of `db`'s schema is left.
async fn assert_no_listener(db: &TestDb, what: &str) {
    eventually(what)
        .equals(0, || std::future::ready(listener_count(db)))
        .await;
}

/// The stream wakes once on connect and once per `NOTIFY`; dropping it
/// closes its `LISTEN` connection (no task lives on without it).
#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_wakeup_stream_closes_the_listen_connection() {
    let db = TestDb::new("listen_drop").await;
    let store = listening_store(&db);
    let mut wakeups = Box::pin(store.wakeups());
    next_wakeup(&mut wakeups, PUBLISH_BOUND, "a wakeup once connected").await;
    wait_for_listener(&db, None).await;

    let mut conn = db.conn().await;
    record(&db, &mut conn, 1).await;
    next_wakeup(&mut wakeups, PUBLISH_BOUND, "a wakeup on NOTIFY").await;
    assert_eq!(listener_count(&db), 1, "one listener session");

    drop(wakeups);
    assert_no_listener(
        &db,
        "the listener session ended after the stream was dropped",
    )
    .await;
    // The store itself (and its pool) is still usable.
    assert_eq!(store.schema().name(), db.schema);
}

/// After the listener session is killed the stream reconnects and wakes
/// once more (so the relay rescans the backlog), without a `NOTIFY`.
#[tokio::test(flavor = "multi_thread")]
async fn the_wakeup_stream_wakes_again_after_a_reconnect() {
    let db = TestDb::new("listen_rewake").await;
    let store = listening_store(&db);
    let mut wakeups = Box::pin(store.wakeups());
    next_wakeup(&mut wakeups, PUBLISH_BOUND, "a wakeup once connected").await;
    let pid = wait_for_listener(&db, None).await;
    db.execute(&format!("SELECT pg_terminate_backend({pid})"));
    next_wakeup(
        &mut wakeups,
        Duration::from_secs(10),
        "a wakeup after the reconnect",
    )
    .await;
    let new_pid = wait_for_listener(&db, Some(pid)).await;
    assert_ne!(new_pid, pid);
    drop(wakeups);
    assert_no_listener(
        &db,
        "the reconnected listener session ended after the stream was dropped",
    )
    .await;
}

/// A relay that stops drops its wakeup stream: its `LISTEN` session ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_relay_leaves_no_listen_session() {
    let db = TestDb::new("listen_stop").await;
    let (handle, _publisher, task) = start_relay(&db);
    wait_for_listener(&db, None).await;
    stop_relay(handle, task).await;
    assert_no_listener(&db, "the listener session ended with the relay").await;
}
