//! The test kit: a private, migrated schema per test on the real
//! PostgreSQL, events recorded and failed through the store, and the built
//! `outbox` binary pointed at that schema.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod broker;

use std::sync::atomic::{AtomicU32, Ordering};

use assert_cmd::Command;
use diesel::{Connection as _, PgConnection, RunQueryDsl as _};
use outbox_core::{Claim as _, FailedAttempt, NextStep, OutboxStore as _};
use outbox_diesel::{Outbox, PgOutboxStore};
use uuid::Uuid;

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A schema name of its own for `test` (at most 63 bytes).
pub fn schema_name(test: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut schema = format!("t_cli_{test}_{}_{n}", std::process::id());
    schema.truncate(63);
    schema
}

/// A schema of its own for one test, dropped when the test ends (also when
/// it panics).
pub struct TestDb {
    pub url: String,
    pub schema: String,
    pub outbox: Outbox,
}

impl TestDb {
    /// A migrated schema.
    pub async fn new(test: &str) -> TestDb {
        let db = TestDb::unmigrated(test);
        let mut conn = outbox_diesel::connect(&db.url).await.unwrap_or_else(|e| {
            panic!(
                "{e}\n(this test needs PostgreSQL: run scripts/dev-services, or set DATABASE_URL)"
            )
        });
        outbox_diesel::migrate(&mut conn, &db.schema).await.unwrap();
        db
    }

    /// A schema name that does not exist yet (dropped all the same).
    pub fn unmigrated(test: &str) -> TestDb {
        let schema = schema_name(test);
        TestDb {
            url: database_url(),
            outbox: Outbox::new(&schema).unwrap(),
            schema,
        }
    }

    pub fn store(&self) -> PgOutboxStore {
        PgOutboxStore::builder(outbox_diesel::pool(&self.url, 2).unwrap())
            .schema(&self.schema)
            .build()
            .unwrap()
    }

    /// The `outbox` binary on this schema, without a terminal or colour.
    pub fn outbox(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox"));
        cmd.env("DATABASE_URL", &self.url)
            .env("OUTBOX_SCHEMA", &self.schema)
            .env("NO_COLOR", "1")
            .env_remove("AMQP_URL");
        cmd
    }

    /// Runs `args` with `--json`, expects exit 0, parses stdout.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let output = self.outbox().arg("--json").args(args).output().unwrap();
        assert!(
            output.status.success(),
            "outbox {args:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// `UPDATE`/`INSERT` with `{schema}` replaced.
    pub fn execute(&self, sql: &str) {
        let sql = sql.replace("{schema}", &format!("\"{}\"", self.schema));
        let mut conn = PgConnection::establish(&self.url).unwrap();
        diesel::sql_query(sql).execute(&mut conn).unwrap();
    }

    /// `SELECT count(*) FROM <schema>.<table>`.
    pub fn count(&self, table: &str) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let sql = format!("SELECT count(*) AS n FROM \"{}\".{table}", self.schema);
        let mut conn = PgConnection::establish(&self.url).unwrap();
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .unwrap()
            .n
    }

    /// Records one `piece.moved` event per aggregate name, in order.
    pub async fn record(&self, aggregates: &[&str]) -> Vec<Uuid> {
        use diesel_async::AsyncConnection as _;
        let mut conn = outbox_diesel::connect(&self.url).await.unwrap();
        let events: Vec<Moved> = aggregates
            .iter()
            .enumerate()
            .map(|(n, a)| Moved {
                aggregate: (*a).to_owned(),
                n: n as u32,
            })
            .collect();
        conn.transaction::<_, outbox_diesel::Error, _>(async |conn| {
            self.outbox.record_all(conn, &events).await
        })
        .await
        .unwrap()
    }

    /// Claims what is claimable and marks `ids` failed with `next`.
    pub async fn fail(&self, ids: &[Uuid], error: &str, next: NextStep) {
        let store = self.store();
        let mut claim = store.claim(1_000).await.unwrap().expect("claimable");
        let failures: Vec<FailedAttempt> = ids
            .iter()
            .map(|id| FailedAttempt {
                id: *id,
                attempts: 5,
                error: format!("{error} ({id})"),
                next,
                unroutable_since: None,
            })
            .collect();
        claim.mark_failed(&failures).await.unwrap();
        claim.finish().await.unwrap();
    }

    /// What a relay's claim gets now (rolled back).
    pub async fn claimable(&self) -> Vec<Uuid> {
        let store = self.store();
        let ids = match store.claim(100).await.unwrap() {
            Some(claim) => claim.records().iter().map(|r| r.id()).collect(),
            None => Vec::new(),
        };
        // The dropped claim's connection closes (and PostgreSQL releases its
        // rows) only when the runtime runs its task: let it, before the test
        // blocks on a CLI process that would wait for those rows.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        ids
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
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

#[derive(Debug, Clone, serde::Serialize)]
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
}
