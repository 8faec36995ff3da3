//! Shared test harness: a private schema per test on the real PostgreSQL
//! ([`TestDb`], in `db.rs`, which outbox-axum's and outbox-cli's tests
//! share), the sample event, and the store under the conformance checks.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use outbox_core::testing::TestEvent;
use outbox_core::testing::conformance::{Fixture, RecordError, Refusal};
use outbox_diesel::PgOutboxStore;
use outbox_testkit::names;
use outbox_testkit::pg;

#[allow(unused_imports)]
pub use outbox_testkit::urls::{DEFAULT_DATABASE_URL as DEFAULT_URL, database_url};

mod db;

pub use db::TestDb;

/// outbox-diesel's own constructors and helpers.
impl TestDb {
    /// A migrated schema of its own for `test`.
    pub async fn new(test: &str) -> TestDb {
        Self::with_schema(names::unique("t", test)).await
    }

    /// As [`TestDb::new`], with a schema name of the longest length
    /// PostgreSQL takes, 63 bytes (the name is padded with `x`).
    pub async fn new_long(test: &str) -> TestDb {
        Self::with_schema(names::longest("t", test)).await
    }

    /// A schema as the first released version left it: migration 1 only.
    pub async fn at_version_1(test: &str) -> TestDb {
        use diesel_async::SimpleAsyncConnection;
        let db = Self::reserve(names::unique("t", test), 6);
        let schema = outbox_diesel::Schema::new(&db.schema).unwrap();
        let first = &outbox_diesel::MIGRATIONS[0];
        assert_eq!(first.version, 1);
        pg::connect(&db.url)
            .await
            .batch_execute(&format!(
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
        db
    }

    async fn with_schema(name: String) -> TestDb {
        let db = Self::reserve(name, 6);
        assert_eq!(
            db.migrate().await,
            vec![1, 2, 3, 4, 5],
            "a fresh schema gets every migration"
        );
        db
    }

    pub fn store(&self) -> PgOutboxStore {
        PgOutboxStore::builder(self.pool.clone())
            .schema(&self.schema)
            .build()
            .unwrap()
    }

    /// `SELECT count(*) FROM <schema>.<table> [WHERE ...]`.
    pub fn count(&self, table: &str, filter: &str) -> i64 {
        pg::count_sync(
            &mut self.sync_conn(),
            &self.sql(&format!(
                "SELECT count(*) AS n FROM {{schema}}.{table} {filter}"
            )),
        )
    }
}

/// A `piece.moved` event of aggregate `piece`/`aggregate`, version `n`,
/// payload `{"aggregate": aggregate, "n": n}`.
pub fn moved(aggregate: &str, n: u32) -> TestEvent {
    TestEvent::new(aggregate)
        .of_type("piece", "piece.moved")
        .version(i64::from(n))
        .field("n", n)
}

/// The first event (n = 0) of each of `aggregates`, for [`record`].
pub fn one_each(aggregates: &[&str]) -> Vec<(String, u32)> {
    aggregates.iter().map(|a| ((*a).to_owned(), 0)).collect()
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

/// The seqs (the claim's keys for marks) of the claimed events `ids`, in
/// the order of `ids`.
pub fn seqs_of(claim: &impl outbox_core::Claim, ids: &[uuid::Uuid]) -> Vec<i64> {
    ids.iter().map(|id| seq_of(claim, *id)).collect()
}

/// The seq (the claim's key for marks) of the claimed event `id`.
pub fn seq_of(claim: &impl outbox_core::Claim, id: uuid::Uuid) -> i64 {
    claim
        .records()
        .iter()
        .find(|r| r.id() == id)
        .expect("the event is part of the claim")
        .seq
}

/// A fresh schema under the store contracts of
/// [`outbox_core::testing::conformance`].
pub struct PgFixture {
    pub db: TestDb,
    store: PgOutboxStore,
}

impl PgFixture {
    pub async fn new(test: &str) -> PgFixture {
        let db = TestDb::new(test).await;
        PgFixture {
            store: db.store(),
            db,
        }
    }
}

impl Fixture for PgFixture {
    type Store = PgOutboxStore;

    fn store(&self) -> &PgOutboxStore {
        &self.store
    }

    async fn record(&self, events: &[TestEvent]) -> Result<Vec<uuid::Uuid>, RecordError> {
        use diesel_async::AsyncConnection as _;
        let mut conn = outbox_diesel::connect(&self.db.url).await?;
        Ok(conn
            .transaction::<_, outbox_diesel::Error, _>(async |conn| {
                self.db.outbox.record_all(conn, events).await
            })
            .await?)
    }

    fn refusal(error: &outbox_diesel::Error) -> Option<Refusal> {
        match error {
            outbox_diesel::Error::NotInClaim { seq } => Some(Refusal::NotInClaim { seq: *seq }),
            outbox_diesel::Error::DuplicateSeq { seq } => Some(Refusal::DuplicateSeq { seq: *seq }),
            _ => None,
        }
    }
}
