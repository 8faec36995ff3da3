//! The harness of the end-to-end tests: [`Shop`] (a database, broker
//! objects, a port and the service's processes of one test, all removed or
//! killed when it ends), what the service stored ([`Footprint`]) and
//! polling with the tests' deadline.

use outbox_testkit::amqp::TestBroker;
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names;
use outbox_testkit::net::free_port;
use outbox_testkit::pg::TestDatabase;
use outbox_testkit::sqlite::TestSqliteFile;
use outbox_testkit::urls::{amqp_url, database_url, mysql_url};
use outbox_tests::example_binary as binary;
use std::collections::HashMap;
use std::fmt::Debug;
use std::fs::OpenOptions;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;
use lapin::message::Delivery;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};
use outbox::rabbitmq::{declare_exchange, wire};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

/// How long an eventual effect may take (the contract says 5 s on an idle
/// system; the tests run in parallel).
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);
/// How long a process may take to answer `/healthz` after it was started.
pub(crate) const STARTUP: Duration = Duration::from_secs(30);

/// Polls `probe` until it returns `expected`; fails after [`DEADLINE`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, expected: T, probe: F)
where
    T: PartialEq + Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    outbox_testkit::eventually::eventually(what)
        .within(DEADLINE)
        .every(Duration::from_millis(100))
        .equals(expected, probe)
        .await;
}

/// What the service has stored: [`Shop::footprint`].
#[derive(QueryableByName, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Footprint {
    #[diesel(sql_type = BigInt)]
    pub(crate) orders: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) order_items: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) outbox_events: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) skus: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) available: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) reserved: i64,
}

/// The database back end a [`Shop`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Postgres,
    Mysql,
    Sqlite,
}

/// A test's database, removed when the test ends (also when it panics).
enum Database {
    Postgres(TestDatabase),
    Mysql(TestMysqlDatabase),
    /// The file (with its `-wal` and `-shm` companions).
    Sqlite(TestSqliteFile),
}

/// One test's private e-commerce deployment.
pub(crate) struct Shop {
    pub(crate) backend: Backend,
    pub(crate) database_url: String,
    pub(crate) exchange: String,
    pub(crate) prefix: String,
    pub(crate) port: u16,
    pub(crate) logs: PathBuf,
    pub(crate) children: HashMap<&'static str, Child>,
    pub(crate) http: reqwest::Client,
    pub(crate) channel: Channel,
    /// Messages taken from the capture queue and not yet asked for.
    pub(crate) captured: Mutex<Vec<Delivery>>,
    /// More environment for every role started from now on.
    pub(crate) env: Vec<(&'static str, String)>,
    /// Deletes the exchanges and queues (also when the test panics).
    pub(crate) broker: TestBroker,
    /// Drops the database (also when the test panics).
    _database: Database,
}

impl Shop {
    /// Names, a port and a broker connection, on PostgreSQL; starts
    /// nothing yet.
    pub(crate) async fn new(test: &str) -> Shop {
        Shop::on(Backend::Postgres, test).await
    }

    /// [`new`](Shop::new) on `backend`.
    pub(crate) async fn on(backend: Backend, test: &str) -> Shop {
        let name = names::unique("ecommerce", test);
        let logs = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("ecommerce")
            .join(format!("{test}-{name}"));
        std::fs::create_dir_all(&logs).unwrap();
        let database = match backend {
            Backend::Postgres => {
                let base = database_url();
                if let Err(error) = outbox::postgres::connect(&base).await {
                    panic!(
                        "{error}\n(these tests need PostgreSQL at {base} and RabbitMQ at {}: run \
                         scripts/dev-services, or set DATABASE_URL and AMQP_URL)",
                        amqp_url()
                    );
                }
                // The processes create the database; it is dropped all the same.
                Database::Postgres(TestDatabase::reserve(&base, &name))
            }
            // Created here (the service would create it too), dropped at the end.
            Backend::Mysql => Database::Mysql(TestMysqlDatabase::create(&mysql_url(), &name).await),
            Backend::Sqlite => Database::Sqlite(TestSqliteFile::at(logs.join("shop.db"))),
        };
        let database_url = match &database {
            Database::Postgres(db) => db.url().to_owned(),
            Database::Mysql(db) => db.url().to_owned(),
            Database::Sqlite(file) => file.url(),
        };
        let broker = TestBroker::new(&name).await;
        let exchange = broker.named("events");
        broker.delete_exchange_on_drop(&exchange);
        for consumer in ["inventory", "loyalty", "orders"] {
            let queue = broker.named(consumer);
            broker.delete_queue_on_drop(format!("{queue}.dead"));
            broker.delete_exchange_on_drop(format!("{queue}.dlx"));
            broker.delete_queue_on_drop(queue);
        }
        broker.delete_queue_on_drop(broker.named("capture"));
        Shop {
            backend,
            database_url,
            exchange,
            prefix: name,
            port: free_port(),
            logs,
            children: HashMap::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            channel: broker.channel().clone(),
            captured: Mutex::new(Vec::new()),
            env: Vec::new(),
            broker,
            _database: database,
        }
    }

    /// Starts `roles`, each in its own process, all at once (so they also
    /// race to create the database), then waits until an HTTP role answers
    /// `/healthz`.
    pub(crate) async fn start(&mut self, roles: &[&'static str]) {
        for role in roles {
            self.spawn(role);
        }
        if roles.iter().any(|role| matches!(*role, "api" | "all")) {
            self.wait_healthy().await;
        }
    }

    pub(crate) fn spawn(&mut self, role: &'static str) {
        assert!(!self.children.contains_key(role), "{role} already runs");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(role))
            .unwrap();
        let child = Command::new(binary())
            .arg(role)
            .env("DATABASE_URL", &self.database_url)
            .env("AMQP_URL", amqp_url())
            .env("BIND", format!("127.0.0.1:{}", self.port))
            .env("EXCHANGE", &self.exchange)
            .env("QUEUE_PREFIX", &self.prefix)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary().display()));
        self.children.insert(role, child);
    }

    pub(crate) fn log(&self, role: &str) -> PathBuf {
        self.logs.join(format!("{role}.log"))
    }

    pub(crate) async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(response) = self.http.get(self.url("/healthz")).send().await
                && response.status() == StatusCode::OK
            {
                let body: Value = response.json().await.unwrap();
                assert_eq!(
                    body,
                    json!({"status": "ok", "database": "ok", "broker": "ok"})
                );
                return;
            }
            for (role, child) in &mut self.children {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("the {role} process exited at start with {status}");
                }
            }
            assert!(
                Instant::now() < deadline,
                "no healthy /healthz within {STARTUP:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills `role` with SIGKILL: no shutdown code runs.
    pub(crate) fn kill(&mut self, role: &str) {
        let mut child = self.children.remove(role).expect("a running role");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Sends SIGTERM to `role` and returns its exit status (within 10 s).
    pub(crate) fn terminate(&mut self, role: &str) -> ExitStatus {
        let mut child = self.children.remove(role).expect("a running role");
        let sent = Command::new("sh")
            .args(["-c", &format!("kill -TERM {}", child.id())])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {}", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{role} did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) async fn request(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("a {status} response that is not JSON ({e}): {text:?}"));
        (status, body)
    }

    pub(crate) async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.request(self.http.get(self.url(path))).await
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(self.http.post(self.url(path)).json(&body))
            .await
    }

    /// `GET` on the admin API with `token`.
    pub(crate) async fn admin_get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        self.request(self.http.get(self.url(path)).bearer_auth(token))
            .await
    }

    /// `POST` of JSON to the admin API with `token`, if any.
    pub(crate) async fn admin_post(
        &self,
        token: Option<&str>,
        path: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let mut request = self.http.post(self.url(path)).json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        self.request(request).await
    }

    pub(crate) async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(self.http.put(self.url(path)).json(&body))
            .await
    }

    pub(crate) async fn metrics(&self) -> String {
        let response = self.http.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    pub(crate) async fn set_stock(&self, sku: &str, available: i64) {
        let (status, body) = self
            .put(
                &format!("/inventory/{sku}"),
                json!({ "available": available }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    /// `(available, reserved)` of `sku`.
    pub(crate) async fn stock(&self, sku: &str) -> (i64, i64) {
        let (status, body) = self.get(&format!("/inventory/{sku}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        (
            body["available"].as_i64().unwrap(),
            body["reserved"].as_i64().unwrap(),
        )
    }

    /// Places an order of `(sku, quantity, unit price)` lines; returns its id.
    pub(crate) async fn place(&self, customer: Uuid, items: &[(&str, i64, i64)]) -> Uuid {
        let items: Vec<Value> = items
            .iter()
            .map(|(sku, quantity, price)| {
                json!({"sku": sku, "quantity": quantity, "unit_price_cents": price})
            })
            .collect();
        let (status, body) = self
            .post("/orders", json!({"customer_id": customer, "items": items}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().unwrap().parse().unwrap()
    }

    /// `POST /orders/{id}/{action}`, expecting `200` with the new status.
    pub(crate) async fn transition(&self, order: Uuid, action: &str, status: &str) {
        let (code, body) = self
            .post(&format!("/orders/{order}/{action}"), Value::Null)
            .await;
        assert_eq!(code, StatusCode::OK, "{action} {order}: {body}");
        assert_eq!(body, json!({"id": order, "status": status}));
    }

    pub(crate) async fn status(&self, order: Uuid) -> String {
        let (code, body) = self.get(&format!("/orders/{order}")).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        body["status"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn points(&self, customer: Uuid) -> i64 {
        let (code, body) = self.get(&format!("/customers/{customer}/points")).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(body["customer_id"], json!(customer));
        body["points"].as_i64().unwrap()
    }

    /// `SELECT count(*) AS n …` on the test's database.
    pub(crate) async fn count(&self, sql: &str) -> i64 {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let count: Count = self.query(sql).await;
        count.n
    }

    /// The one row of `sql` on the test's database, whatever its back end.
    pub(crate) async fn query<T>(&self, sql: &str) -> T
    where
        T: QueryableByName<diesel::pg::Pg>
            + QueryableByName<diesel::mysql::Mysql>
            + QueryableByName<diesel::sqlite::Sqlite>
            + Send
            + 'static,
    {
        let query = diesel::sql_query(sql);
        match self.backend {
            Backend::Postgres => {
                let mut conn = outbox::postgres::connect(&self.database_url).await.unwrap();
                query.get_result(&mut conn).await.unwrap()
            }
            Backend::Mysql => {
                let mut conn = outbox::mysql::connect(&self.database_url).await.unwrap();
                query.get_result(&mut conn).await.unwrap()
            }
            Backend::Sqlite => {
                let mut conn = outbox::sqlite::connect(&self.database_url).await.unwrap();
                query.get_result(&mut conn).await.unwrap()
            }
        }
    }

    pub(crate) async fn inbox_rows(&self, consumer: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) AS n FROM inbox_events WHERE consumer = '{consumer}'"
        ))
        .await
    }

    pub(crate) async fn unsent_events(&self) -> i64 {
        self.count("SELECT count(*) AS n FROM outbox_events WHERE status <> 'sent'")
            .await
    }

    pub(crate) fn queue(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    /// Messages ready in `queue`.
    pub(crate) async fn ready(&self, queue: &str) -> u32 {
        self.broker.ready(queue).await
    }

    /// Binds a queue of the test's own to the exchange with `#`, so every
    /// published event can be inspected (and copied) later. Call before the
    /// events are published.
    pub(crate) async fn capture(&self) {
        declare_exchange(&self.channel, &self.exchange, ExchangeKind::Topic)
            .await
            .unwrap();
        let queue = self
            .broker
            .queue_with(
                &self.queue("capture"),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await;
        self.broker.bind(&queue, &self.exchange, "#").await;
    }

    /// The published `event_type` message of order `order`, from the
    /// capture queue.
    pub(crate) async fn captured(&self, event_type: &str, order: Uuid) -> Delivery {
        let is_it = |delivery: &Delivery| {
            delivery.routing_key.as_str() == event_type
                && delivery
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| wire::header_str(h, wire::AGGREGATE_ID))
                    == Some(order.to_string().as_str())
        };
        let deadline = Instant::now() + DEADLINE;
        loop {
            {
                let mut kept = self.captured.lock().unwrap();
                if let Some(i) = kept.iter().position(is_it) {
                    return kept.remove(i);
                }
            }
            let got = self
                .channel
                .basic_get(
                    self.queue("capture").as_str().into(),
                    BasicGetOptions { no_ack: true },
                )
                .await
                .unwrap();
            match got {
                Some(message) => self.captured.lock().unwrap().push(message.delivery),
                None => {
                    assert!(
                        Instant::now() < deadline,
                        "no {event_type} of order {order} published within {DEADLINE:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Publishes an exact copy of `delivery` (body and properties, so the
    /// same `message_id`) straight into `queue`, through the default exchange.
    pub(crate) async fn inject(&self, delivery: &Delivery, queue: &str) {
        self.publish_to(queue, &delivery.data, delivery.properties.clone())
            .await;
    }

    /// Publishes `body` with `properties` straight into `queue`, through the
    /// default exchange, and waits for the broker's confirm.
    pub(crate) async fn publish_to(&self, queue: &str, body: &[u8], properties: BasicProperties) {
        let confirm = self.broker.publish("", queue, body, properties).await;
        assert_eq!(confirm, Confirmation::Ack(None), "published into {queue}");
    }

    /// Takes exactly `n` messages from the dead-letter queue of consumer
    /// queue `name`, waiting up to [`DEADLINE`] for them; checks that no
    /// more follow.
    pub(crate) async fn dead_letters(&self, name: &str, n: usize) -> Vec<Delivery> {
        let queue = format!("{}.dead", self.queue(name));
        let mut dead = Vec::new();
        let deadline = Instant::now() + DEADLINE;
        while dead.len() < n {
            let got = self
                .channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap();
            match got {
                Some(message) => dead.push(message.delivery),
                None => {
                    assert!(
                        Instant::now() < deadline,
                        "{queue}: {} of {n} dead letters within {DEADLINE:?}",
                        dead.len()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        assert_eq!(self.ready(&queue).await, 0, "{queue}: no more dead letters");
        dead
    }

    /// `true` while the process of `role` runs.
    pub(crate) fn alive(&mut self, role: &str) -> bool {
        let child = self.children.get_mut(role).expect("a started role");
        child.try_wait().unwrap().is_none()
    }

    /// What the API's requests leave behind: rows and stock.
    pub(crate) async fn footprint(&self) -> Footprint {
        // A sum is `DECIMAL` on MariaDB: cast to its 64-bit integer.
        let bigint = match self.backend {
            Backend::Mysql => "SIGNED",
            Backend::Postgres | Backend::Sqlite => "BIGINT",
        };
        self.query(&format!(
            "SELECT (SELECT count(*) FROM orders) AS orders, \
             (SELECT count(*) FROM order_items) AS order_items, \
             (SELECT count(*) FROM outbox_events) AS outbox_events, \
             (SELECT count(*) FROM inventory) AS skus, \
             (SELECT CAST(coalesce(sum(available), 0) AS {bigint}) FROM inventory) AS available, \
             (SELECT CAST(coalesce(sum(reserved), 0) AS {bigint}) FROM inventory) AS reserved"
        ))
        .await
    }

    /// `POST path` with `body` sent in chunks (`Transfer-Encoding: chunked`,
    /// no `Content-Length`), over a plain socket.
    pub(crate) async fn chunked_post(&self, path: &str, body: &[u8]) -> (StatusCode, Value) {
        use std::io::{Read, Write};
        let port = self.port;
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n"
        )
        .into_bytes();
        for chunk in body.chunks(8192) {
            request.extend(format!("{:x}\r\n", chunk.len()).bytes());
            request.extend(chunk);
            request.extend(b"\r\n");
        }
        request.extend(b"0\r\n\r\n");
        let response = tokio::task::spawn_blocking(move || {
            let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            socket
                .set_write_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            // The server may answer (and stop reading) before the end.
            let _ = socket.write_all(&request);
            let mut response = Vec::new();
            let _ = socket.read_to_end(&mut response);
            String::from_utf8_lossy(&response).into_owned()
        })
        .await
        .unwrap();
        let status: u16 = response
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
        let (head, payload) = response
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no body in {response:?}"));
        // The answer itself may be chunked: take the JSON object in it.
        let json = payload
            .find('{')
            .zip(payload.rfind('}'))
            .map_or("", |(start, end)| &payload[start..=end]);
        let body = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("a response that is not JSON ({e}): {head}\n{payload}"));
        (StatusCode::from_u16(status).unwrap(), body)
    }

    /// The counter `name{consumer="..."}` on `/metrics` (0 when absent).
    pub(crate) async fn consumer_counter(&self, name: &str, consumer: &str) -> u64 {
        let prefix = format!("{name}{{consumer=\"{consumer}\"}} ");
        self.metrics()
            .await
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(0, |value| value.trim().parse().unwrap())
    }

    pub(crate) fn print_logs(&self) {
        for role in ["all", "api", "relay", "inventory", "loyalty"] {
            let Ok(text) = std::fs::read_to_string(self.log(role)) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- last lines of {} ---\n{}",
                self.log(role).display(),
                tail.join("\n")
            );
        }
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            self.print_logs();
        } else {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}
