//! The test kit: a private, migrated schema per test on the real
//! PostgreSQL (the [`TestDb`] of outbox-diesel's tests, shared), events
//! recorded and failed through the store, and the built `outbox` binary
//! pointed at that schema.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod broker;

use assert_cmd::Command;
use outbox_core::testing::{TestEvent, fail_claimed};
use outbox_core::{Claim as _, NextStep, OutboxStore as _};
use outbox_diesel::PgOutboxStore;
use outbox_testkit::names;
use outbox_testkit::pg;
use uuid::Uuid;

#[allow(unused_imports)]
pub use outbox_testkit::urls::{DEFAULT_DATABASE_URL as DEFAULT_URL, database_url};

/// A schema name of its own for `test` (at most 63 bytes).
pub fn schema_name(test: &str) -> String {
    names::unique("t_cli", test)
}

#[path = "../../../outbox-diesel/tests/common/db.rs"]
mod db;

pub use db::TestDb;

/// The CLI's own constructors and helpers.
impl TestDb {
    /// A migrated schema.
    pub async fn new(test: &str) -> TestDb {
        let db = TestDb::unmigrated(test);
        db.migrate().await;
        db
    }

    /// A schema name that does not exist yet (dropped all the same).
    pub fn unmigrated(test: &str) -> TestDb {
        TestDb::reserve(schema_name(test), 2)
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

    /// `SELECT count(*) FROM <schema>.<table>`.
    pub fn count(&self, table: &str) -> i64 {
        pg::count_sync(
            &mut self.sync_conn(),
            &self.sql(&format!("SELECT count(*) AS n FROM {{schema}}.{table}")),
        )
    }

    /// Records one `piece.moved` event per aggregate name, in order.
    pub async fn record(&self, aggregates: &[&str]) -> Vec<Uuid> {
        use diesel_async::AsyncConnection as _;
        let mut conn = outbox_diesel::connect(&self.url).await.unwrap();
        let events: Vec<TestEvent> = aggregates
            .iter()
            .enumerate()
            .map(|(n, a)| {
                TestEvent::new(*a)
                    .of_type("piece", "piece.moved")
                    .field("n", n)
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
        fail_claimed(&self.store(), ids, 5, next, |id| format!("{error} ({id})"))
            .await
            .unwrap();
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
