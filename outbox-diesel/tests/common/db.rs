//! The PostgreSQL test database the PostgreSQL-backed test crates share:
//! outbox-diesel's tests, and outbox-axum's and outbox-cli's, which include
//! this file with `#[path]`. A schema of its own per test on the test kit's
//! [`TestSchema`] (dropped when the test ends, also when it panics), the
//! outbox in it, a pool, and SQL with `{schema}` replaced. Each crate's
//! `tests/common` adds what only its tests need in an `impl TestDb` of its
//! own.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use diesel::{Connection as _, PgConnection, RunQueryDsl as _};
use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox_diesel::Outbox;
use outbox_testkit::pg::{self, TestSchema};
use outbox_testkit::urls::database_url;

/// A schema of its own for one test, dropped when the test ends (also when
/// it panics).
pub struct TestDb {
    pub url: String,
    pub schema: String,
    pub pool: Pool<AsyncPgConnection>,
    pub outbox: Outbox,
    /// Drops the schema; last, after the pool.
    guard: TestSchema,
}

impl TestDb {
    /// Schema `name` on the test database, not created yet (dropped all
    /// the same), with a pool of up to `pool_size` connections.
    pub fn reserve(name: String, pool_size: usize) -> TestDb {
        let guard = TestSchema::reserve(&database_url(), name);
        TestDb {
            url: guard.url().to_owned(),
            schema: guard.name().to_owned(),
            pool: outbox_diesel::pool(guard.url(), pool_size).unwrap(),
            outbox: Outbox::new(guard.name()).unwrap(),
            guard,
        }
    }

    /// Creates the schema with every migration; the versions applied.
    pub async fn migrate(&self) -> Vec<i32> {
        outbox_diesel::migrate(&mut pg::connect(&self.url).await, &self.schema)
            .await
            .unwrap()
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        outbox_diesel::connect(&self.url).await.unwrap()
    }

    pub fn sync_conn(&self) -> PgConnection {
        PgConnection::establish(&self.url).unwrap()
    }

    /// `sql` with `{schema}` replaced by the quoted schema.
    pub fn sql(&self, sql: &str) -> String {
        self.guard.sql(sql)
    }

    /// As [`TestDb::execute`], returning the database's refusal.
    pub fn try_execute(&self, sql: &str) -> Result<usize, diesel::result::Error> {
        diesel::sql_query(self.sql(sql)).execute(&mut self.sync_conn())
    }

    /// `UPDATE`/`INSERT`/... with `{schema}` replaced.
    pub fn execute(&self, sql: &str) {
        self.try_execute(sql).unwrap();
    }
}
