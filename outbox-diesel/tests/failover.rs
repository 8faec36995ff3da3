//! Failover support on the shared PostgreSQL (the fault suite's
//! `pg_failover` scenarios run a real primary and standby): a URL naming
//! several hosts connects to the first that takes writes; a server that
//! takes none (here a session made read-only by its startup options, as a
//! standby's is) is refused with a clear error, and a pooled connection that
//! answers "read-only" is closed, not reused; the `LISTEN` connection's
//! liveness check replaces a connection that went silent (a frozen TCP
//! proxy, as a half-open socket after a failover looks), and the relay then
//! rescans the backlog.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{TestDb, moved};
use diesel_async::{AsyncConnection as _, RunQueryDsl as _};
use outbox_core::OutboxStore as _;
use outbox_core::testing::{RecordingPublisher, wakeup_driven};
use outbox_diesel::{Error, PgOutboxStore};
use outbox_testkit::net::free_port;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// `url` (the shared server's) with `key=value` added to its query.
fn with_param(url: &str, param: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{param}")
}

/// The shared server's URL as `postgres://user@host:port/db...`, with a
/// host that refuses connections listed first.
fn behind_a_dead_host(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (credentials, host_and_more) = rest.rsplit_once('@').unwrap();
    format!(
        "{scheme}://{credentials}@127.0.0.1:{},{host_and_more}",
        free_port()
    )
}

/// Every session of `url` read-only, as on a standby.
fn read_only(url: &str) -> String {
    with_param(url, "options=-c%20default_transaction_read_only%3Don")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_multi_host_url_connects_to_the_host_that_takes_writes() {
    let db = TestDb::new("failover_multi_host").await;
    let url = behind_a_dead_host(&db.url);
    let mut conn = outbox_diesel::connect(&url).await.unwrap();
    conn.transaction::<_, Error, _>(async |conn| db.outbox.record(conn, &moved("m", 1)).await)
        .await
        .unwrap();
    let pool = outbox_diesel::pool(&url, 2).unwrap();
    let mut pooled = pool.get().await.unwrap();
    diesel::sql_query("SELECT 1")
        .execute(&mut *pooled)
        .await
        .unwrap();
    assert_eq!(db.count("outbox_events", ""), 1);
}

/// A port that accepts TCP connections and never answers (a frozen
/// postmaster, or a machine whose kernel still answers): each connection is
/// held open, silent.
async fn silent_host() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    port
}

/// The shared server's URL with a silent host listed first.
fn behind_a_silent_host(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (credentials, host_and_more) = rest.rsplit_once('@').unwrap();
    format!("{scheme}://{credentials}@127.0.0.1:{port},{host_and_more}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_host_that_never_answers_is_given_up_for_the_next() {
    let db = TestDb::new("failover_silent_first_host").await;
    let silent = silent_host().await;
    // The default limit per host (5 s with several, no connect_timeout in
    // the URL).
    let url = behind_a_silent_host(&db.url, silent);
    // The outer limits only turn a hang into a failure (before, `connect`
    // never returned and the pool gave up after 10 s on the first host).
    let mut conn = tokio::time::timeout(Duration::from_secs(30), outbox_diesel::connect(&url))
        .await
        .expect("connect gives the silent host up")
        .unwrap();
    conn.transaction::<_, Error, _>(async |conn| db.outbox.record(conn, &moved("s", 1)).await)
        .await
        .unwrap();
    let pool = outbox_diesel::pool(&url, 2).unwrap();
    let mut pooled = tokio::time::timeout(Duration::from_secs(30), pool.get())
        .await
        .expect("the pool gives the silent host up")
        .unwrap();
    diesel::sql_query("SELECT 1")
        .execute(&mut *pooled)
        .await
        .unwrap();
    // The URL's connect_timeout is the limit per host when set.
    let quick = with_param(&url, "connect_timeout=1");
    tokio::time::timeout(Duration::from_secs(30), outbox_diesel::connect(&quick))
        .await
        .expect("connect gives the silent host up")
        .unwrap();
    assert_eq!(db.count("outbox_events", ""), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn when_no_host_can_be_used_the_error_names_each_hosts_failure() {
    let db = TestDb::new("failover_no_host").await;
    let silent = silent_host().await;
    let refused = free_port();
    let (_, rest) = db.url.split_once("://").unwrap();
    let (credentials, _) = rest.rsplit_once('@').unwrap();
    let url = format!(
        "postgres://{credentials}@127.0.0.1:{silent},127.0.0.1:{refused}/postgres?connect_timeout=1"
    );
    let error = tokio::time::timeout(Duration::from_secs(30), outbox_diesel::connect(&url))
        .await
        .expect("connect gives every host up")
        .err()
        .expect("no host to connect to");
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "127.0.0.1:{silent}: timed out: no answer within 1 s"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("127.0.0.1:{refused}: ")), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_takes_no_writes_is_refused_with_a_clear_error() {
    let db = TestDb::new("failover_read_only_refused").await;
    let error = outbox_diesel::connect(&read_only(&db.url))
        .await
        .err()
        .expect("no connection to a read-only server (target_session_attrs=read-write)");
    let text = error.to_string();
    assert!(text.contains("does not allow writes"), "{text}");
    assert!(
        text.contains("the database is read-only (a standby?)"),
        "{text}"
    );
    // Asked for explicitly, any server will do.
    let any = with_param(&read_only(&db.url), "target_session_attrs=any");
    outbox_diesel::connect(&any).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_connection_that_answers_read_only_is_closed_not_reused() {
    let db = TestDb::new("failover_read_only_pool").await;
    // `any`: the connections open on the read-only "standby", as ones
    // opened before a primary turned read-only would be.
    let url = with_param(&read_only(&db.url), "target_session_attrs=any");
    let pool = outbox_diesel::pool(&url, 2).unwrap();
    let store = PgOutboxStore::builder(pool.clone())
        .schema(&db.schema)
        .build()
        .unwrap();
    let error = store.purge_sent(chrono::Utc::now(), 10).await.unwrap_err();
    assert!(error.is_read_only(), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("the database is read-only (a standby?)"),
        "{text}"
    );
    assert_eq!(
        pool.status().size,
        0,
        "the connection was closed, not returned to the pool"
    );
    // A store error other than read-only keeps its connection.
    let healthy = outbox_diesel::pool(&db.url, 2).unwrap();
    let store = PgOutboxStore::builder(healthy.clone())
        .schema(&db.schema)
        .build()
        .unwrap();
    store.purge_sent(chrono::Utc::now(), 10).await.unwrap();
    assert_eq!(healthy.status().size, 1);
    // A claim on the read-only server fails (FOR UPDATE), spends nothing.
    record_one(&db).await;
    let store = PgOutboxStore::builder(outbox_diesel::pool(&url, 1).unwrap())
        .schema(&db.schema)
        .build()
        .unwrap();
    let error = store.claim(10).await.expect_err("no claim on a standby");
    assert!(error.is_read_only(), "{error:?}");
    assert_eq!(db.count("outbox_events", "WHERE attempts > 0"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inbox_transaction_answered_read_only_closes_its_connection_on_rollback() {
    use outbox_core::{InboxDatabase as _, admin::DeadLetter};
    use outbox_diesel::{PgInbox, PgInboxDatabase};
    let db = TestDb::new("failover_read_only_inbox").await;
    // Sessions read-only, as on a fenced old primary the connections
    // opened before the fence are.
    let url = with_param(&read_only(&db.url), "target_session_attrs=any");
    let pool = outbox_diesel::pool(&url, 2).unwrap();
    let inbox = PgInboxDatabase::new(pool.clone(), PgInbox::new(&db.schema).unwrap());
    // What the inbox consumer does when its inbox insert fails.
    let mut tx = inbox.begin().await.unwrap();
    let error = inbox
        .receive(&mut tx, "failover", uuid::Uuid::now_v7())
        .await
        .expect_err("no insert on a read-only session");
    assert!(error.is_read_only(), "{error:?}");
    inbox.rollback(tx).await.unwrap();
    assert_eq!(
        pool.status().size,
        0,
        "the connection was closed, not returned to the pool"
    );
    // A dead letter answered read-only: its connection closed too.
    let letter = DeadLetter::new("failover", "q", "x", "r", "handler failed", b"{}");
    let error = inbox.record_dead_letter(&letter).await.unwrap_err();
    assert!(error.is_read_only(), "{error:?}");
    assert_eq!(pool.status().size, 0);
    // On a server that takes writes, a rolled-back transaction keeps its
    // connection.
    let healthy = outbox_diesel::pool(&db.url, 2).unwrap();
    let inbox = PgInboxDatabase::new(healthy.clone(), PgInbox::new(&db.schema).unwrap());
    let mut tx = inbox.begin().await.unwrap();
    inbox
        .receive(&mut tx, "failover", uuid::Uuid::now_v7())
        .await
        .unwrap();
    inbox.rollback(tx).await.unwrap();
    assert_eq!(healthy.status().size, 1);
    // The admin's writes (the audit trail here; the janitor's purges go the
    // same way): read-only answers close the connection too.
    let admin = PgOutboxStore::builder(pool.clone())
        .schema(&db.schema)
        .build()
        .unwrap();
    let entry = outbox_core::admin::AuditEntry::new("t", "purge_sent", serde_json::json!({}));
    let error = outbox_core::admin::OutboxAdmin::begin_audit(&admin, &entry)
        .await
        .unwrap_err();
    assert!(error.is_read_only(), "{error:?}");
    assert_eq!(pool.status().size, 0);
    // The delivery order: read-only answers close the connection too.
    let store = PgOutboxStore::builder(pool.clone())
        .schema(&db.schema)
        .build()
        .unwrap();
    let error = store
        .set_delivery_order(outbox_core::DeliveryOrder::Unordered)
        .await
        .unwrap_err();
    assert!(error.is_read_only(), "{error:?}");
    assert_eq!(pool.status().size, 0);
}

/// A TCP proxy to the shared server whose connections can be frozen: bytes
/// are swallowed and never forwarded, both ways, while the sockets stay
/// open (a half-open connection to a vanished primary). Connections made
/// after a freeze flow.
struct FreezingProxy {
    port: u16,
    connections: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>>,
}

impl FreezingProxy {
    async fn start(upstream_port: u16) -> FreezingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let registry = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let frozen = Arc::new(AtomicBool::new(false));
                registry.lock().unwrap().push(Arc::clone(&frozen));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(client_read, server_write, Arc::clone(&frozen)));
                tokio::spawn(pump(server_read, client_write, frozen));
            }
        });
        FreezingProxy { port, connections }
    }

    /// Freezes every connection open now.
    fn freeze(&self) {
        for frozen in self.connections.lock().unwrap().iter() {
            frozen.store(true, Ordering::SeqCst);
        }
    }

    fn connections(&self) -> usize {
        self.connections.lock().unwrap().len()
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if AtomicBool::load(&frozen, Ordering::SeqCst) {
            // Hold both sockets open, forward nothing, forever.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The port of the shared server's URL.
fn port_of(url: &str) -> u16 {
    let after_at = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    let host_port = after_at.split(['/', '?']).next().unwrap();
    host_port
        .rsplit_once(':')
        .map_or(5432, |(_, port)| port.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_listen_connection_is_replaced_and_the_backlog_rescanned() {
    let db = TestDb::new("failover_listen_liveness").await;
    let proxy = FreezingProxy::start(port_of(&db.url)).await;
    let proxied = db.url.replacen(
        &format!(":{}/", port_of(&db.url)),
        &format!(":{}/", proxy.port),
        1,
    );
    assert_ne!(proxied, db.url, "the URL goes through the proxy");
    let store = PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .listen(&proxied)
        .listen_check(Duration::from_secs(1), Duration::from_secs(1))
        .build()
        .unwrap();
    let publisher = RecordingPublisher::new();
    // Polling is an hour: only a wakeup publishes.
    let relay = wakeup_driven(store, publisher.clone()).build().unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    outbox_testkit::eventually::eventually("the listener connects through the proxy")
        .until(|| std::future::ready(proxy.connections() == 1))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The first event proves the LISTEN connection works.
    let first = record_one(&db).await;
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(1))
        .await
        .expect("published through NOTIFY");
    assert_eq!(publisher.published_ids(), vec![first]);
    assert_eq!(proxy.connections(), 1);
    proxy.freeze();
    // Its NOTIFY goes nowhere: only the liveness check (1 s of silence, a
    // SELECT 1 unanswered for 1 s), the reconnect and its rescan publish it.
    let second = record_one(&db).await;
    tokio::time::timeout(Duration::from_secs(15), publisher.wait_for(2))
        .await
        .expect("published after the frozen LISTEN connection was replaced");
    assert_eq!(publisher.published_ids(), vec![first, second]);
    assert!(proxy.connections() >= 2, "the listener reconnected");
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the relay stops")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listen_connection_to_a_read_only_server_is_replaced() {
    let db = TestDb::new("failover_listen_read_only").await;
    let proxy = FreezingProxy::start(port_of(&db.url)).await;
    let proxied = db.url.replacen(
        &format!(":{}/", port_of(&db.url)),
        &format!(":{}/", proxy.port),
        1,
    );
    // Read-only sessions that answer (a fenced old primary): `SELECT 1`
    // passes there, `SHOW transaction_read_only` does not.
    let listen_url = with_param(&read_only(&proxied), "target_session_attrs=any");
    let store = PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .listen(&listen_url)
        .listen_check(Duration::from_secs(1), Duration::from_secs(1))
        .build()
        .unwrap();
    let relay = wakeup_driven(store, RecordingPublisher::new())
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    outbox_testkit::eventually::eventually("the listener connects through the proxy")
        .until(|| std::future::ready(proxy.connections() >= 1))
        .await;
    outbox_testkit::eventually::eventually("the listener drops the read-only connection")
        .until(|| std::future::ready(proxy.connections() >= 2))
        .await;
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the relay stops")
        .unwrap();
}

/// Records one event in a committed transaction; its id.
async fn record_one(db: &TestDb) -> uuid::Uuid {
    let mut conn = db.conn().await;
    conn.transaction::<_, Error, _>(async |conn| db.outbox.record(conn, &moved("f", 1)).await)
        .await
        .unwrap()
}
