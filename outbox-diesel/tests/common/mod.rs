//! Shared test harness: a private schema per test on the real PostgreSQL.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::{Connection, PgConnection, RunQueryDsl as _};
use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox_diesel::{Outbox, PgOutboxStore};
use serde::Serialize;

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A schema of its own for one test, migrated, dropped when the test ends
/// (also when it panics).
pub struct TestDb {
    pub url: String,
    pub schema: String,
    pub pool: Pool<AsyncPgConnection>,
    pub outbox: Outbox,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestDb {
    pub async fn new(test: &str) -> TestDb {
        let url = database_url();
        let conn = outbox_diesel::connect(&url).await.unwrap_or_else(|e| {
            panic!(
                "{e}\n(this test needs PostgreSQL: run scripts/dev-services, or set DATABASE_URL)"
            )
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut schema = format!("t_{}_{}_{n}", test, std::process::id());
        schema.truncate(63);
        Self::with_schema(url, conn, schema).await
    }

    /// As [`TestDb::new`], with a schema name of the longest length
    /// PostgreSQL takes, 63 bytes (the name is padded with `x`).
    pub async fn new_long(test: &str) -> TestDb {
        let url = database_url();
        let conn = outbox_diesel::connect(&url).await.unwrap();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut schema = format!("t_{}_{}_{n}_", test, std::process::id());
        schema.truncate(63);
        while schema.len() < 63 {
            schema.push('x');
        }
        Self::with_schema(url, conn, schema).await
    }

    /// A schema as the first released version left it: migration 1 only.
    pub async fn at_version_1(test: &str) -> TestDb {
        use diesel_async::SimpleAsyncConnection;
        let url = database_url();
        let mut conn = outbox_diesel::connect(&url).await.unwrap();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut name = format!("t_{}_{}_{n}", test, std::process::id());
        name.truncate(63);
        let schema = outbox_diesel::Schema::new(&name).unwrap();
        let first = &outbox_diesel::MIGRATIONS[0];
        assert_eq!(first.version, 1);
        conn.batch_execute(&format!(
            "CREATE SCHEMA {q};
             CREATE TABLE {q}.outbox_schema_version (
                 version integer PRIMARY KEY, name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now());
             {sql}
             INSERT INTO {q}.outbox_schema_version (version, name) VALUES (1, 'v1');",
            q = schema.quoted(),
            sql = schema.render(first),
        ))
        .await
        .unwrap();
        TestDb {
            pool: outbox_diesel::pool(&url, 6).unwrap(),
            outbox: Outbox::new(&name).unwrap(),
            url,
            schema: name,
        }
    }

    async fn with_schema(url: String, mut conn: AsyncPgConnection, schema: String) -> TestDb {
        let applied = outbox_diesel::migrate(&mut conn, &schema).await.unwrap();
        assert_eq!(
            applied,
            vec![1, 2, 3, 4, 5],
            "a fresh schema gets every migration"
        );
        TestDb {
            pool: outbox_diesel::pool(&url, 6).unwrap(),
            outbox: Outbox::new(&schema).unwrap(),
            url,
            schema,
        }
    }

    pub fn store(&self) -> PgOutboxStore {
        PgOutboxStore::builder(self.pool.clone())
            .schema(&self.schema)
            .build()
            .unwrap()
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        outbox_diesel::connect(&self.url).await.unwrap()
    }

    pub fn sync_conn(&self) -> PgConnection {
        PgConnection::establish(&self.url).unwrap()
    }

    /// `SELECT count(*) FROM <schema>.<table> [WHERE ...]`.
    pub fn count(&self, table: &str, filter: &str) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let sql = format!(
            "SELECT count(*) AS n FROM \"{}\".{table} {filter}",
            self.schema
        );
        diesel::sql_query(sql)
            .get_result::<Count>(&mut self.sync_conn())
            .unwrap()
            .n
    }

    /// As [`TestDb::execute`], returning the database's refusal.
    pub fn try_execute(&self, sql: &str) -> Result<usize, diesel::result::Error> {
        let sql = sql.replace("{schema}", &format!("\"{}\"", self.schema));
        diesel::sql_query(sql).execute(&mut self.sync_conn())
    }

    pub fn execute(&self, sql: &str) {
        let sql = sql.replace("{schema}", &format!("\"{}\"", self.schema));
        diesel::sql_query(sql)
            .execute(&mut self.sync_conn())
            .unwrap();
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // A claim still open in this test (its connection is closed by the
        // runtime, which this blocking drop may be holding up) would make
        // DROP SCHEMA wait: end every other session holding a lock here.
        let kill = format!(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
             JOIN pg_class c ON c.oid = l.relation \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = '{}' AND l.pid <> pg_backend_pid()",
            self.schema
        );
        let drop = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        if let Ok(mut conn) = PgConnection::establish(&self.url) {
            let _ = diesel::sql_query(kill).execute(&mut conn);
            let _ = diesel::sql_query(drop).execute(&mut conn);
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Moved {
    pub aggregate: String,
    pub n: u32,
}

impl outbox_core::DomainEvent for Moved {
    fn aggregate_type(&self) -> &'static str {
        "piece"
    }
    fn event_type(&self) -> &'static str {
        "piece.moved"
    }
    fn aggregate_id(&self) -> String {
        self.aggregate.clone()
    }
    fn aggregate_version(&self) -> Option<i64> {
        Some(i64::from(self.n))
    }
}

pub fn moved(aggregate: &str, n: u32) -> Moved {
    Moved {
        aggregate: aggregate.to_owned(),
        n,
    }
}

/// Records `events` (aggregate, n) as [`moved`] events, one committed
/// transaction per 500; returns their ids in order.
pub async fn record(db: &TestDb, events: &[(String, u32)]) -> Vec<uuid::Uuid> {
    use diesel_async::AsyncConnection as _;
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for chunk in events.chunks(500) {
        let batch: Vec<_> = chunk.iter().map(|(a, n)| moved(a, *n)).collect();
        let chunk_ids = conn
            .transaction::<_, outbox_diesel::Error, _>(async |conn| {
                db.outbox.record_all(conn, &batch).await
            })
            .await
            .unwrap();
        ids.extend(chunk_ids);
    }
    ids
}
