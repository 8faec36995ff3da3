//! `migrate` is idempotent, safe from several instances at once, keeps its
//! history out of diesel's `__diesel_schema_migrations`, and `ddl` applied by
//! hand gives the same working outbox.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{TestDb, moved, seqs_of};
use diesel::RunQueryDsl as _;
use diesel_async::{AsyncConnection as _, SimpleAsyncConnection as _};
use outbox_core::{Claim as _, OutboxStore as _};
use outbox_diesel::{Error, Outbox, PgOutboxStore};
use outbox_testkit::names;

/// Every table a migrated schema holds, sorted.
const TABLES: [&str; 8] = [
    "inbox_dead_letters",
    "inbox_events",
    "outbox_attempts",
    "outbox_audit",
    "outbox_events",
    "outbox_relays",
    "outbox_schema_version",
    "outbox_settings",
];

/// A schema name of its own for `test` (nothing created up front),
/// dropped when the test ends (also when it panics).
fn reserve(test: &str) -> TestDb {
    TestDb::reserve(names::unique("m", test), 2)
}

/// The catalogue queries of these tests.
impl TestDb {
    /// `to_regclass(name)::text`: `None` when no such relation exists.
    fn regclass(&self, name: &str) -> Option<String> {
        #[derive(diesel::QueryableByName)]
        struct Reg {
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            r: Option<String>,
        }
        diesel::sql_query("SELECT to_regclass($1)::text AS r")
            .bind::<diesel::sql_types::Text, _>(name)
            .get_result::<Reg>(&mut self.sync_conn())
            .unwrap()
            .r
    }

    /// The tables of the schema, sorted.
    fn tables(&self) -> Vec<String> {
        #[derive(diesel::QueryableByName)]
        struct Table {
            #[diesel(sql_type = diesel::sql_types::Text)]
            tablename: String,
        }
        diesel::sql_query(
            "SELECT tablename::text AS tablename FROM pg_tables WHERE schemaname = $1 \
             ORDER BY tablename",
        )
        .bind::<diesel::sql_types::Text, _>(&self.schema)
        .load::<Table>(&mut self.sync_conn())
        .unwrap()
        .into_iter()
        .map(|t| t.tablename)
        .collect()
    }
}

/// Records one event, claims it, marks it sent: the outbox in `schema` works.
async fn assert_outbox_works(url: &str, schema: &str) {
    let outbox = Outbox::new(schema).unwrap();
    let mut conn = outbox_diesel::connect(url).await.unwrap();
    let id = conn
        .transaction::<_, Error, _>(async |conn| outbox.record(conn, &moved("m-1", 1)).await)
        .await
        .unwrap();
    let store = PgOutboxStore::builder(outbox_diesel::pool(url, 2).unwrap())
        .schema(schema)
        .build()
        .unwrap();
    let mut claim = store
        .claim(10)
        .await
        .unwrap()
        .expect("the event is claimable");
    let ids: Vec<_> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(ids, vec![id]);
    claim.mark_sent(&seqs_of(&claim, &ids)).await.unwrap();
    claim.finish().await.unwrap();
    assert!(
        store.claim(10).await.unwrap().is_none(),
        "sent, not claimable"
    );
}

#[tokio::test]
async fn second_run_applies_nothing_and_keeps_the_data() {
    let db = reserve("migrate_twice");
    let mut conn = outbox_diesel::connect(&db.url).await.unwrap();
    let applied = outbox_diesel::migrate(&mut conn, &db.schema).await.unwrap();
    assert_eq!(applied, vec![1, 2, 3, 4, 5]);
    assert_outbox_works(&db.url, &db.schema).await;

    let again = outbox_diesel::migrate(&mut conn, &db.schema).await.unwrap();
    assert!(again.is_empty(), "nothing left to apply: {again:?}");
    assert_eq!(db.tables(), TABLES);
    assert_eq!(db.count("outbox_events", "WHERE status = 'sent'"), 1);
    assert_eq!(db.count("outbox_settings", ""), 1);
    assert_eq!(db.count("outbox_schema_version", ""), 5);
    // And through the URL shorthand, likewise nothing.
    let via_url = outbox_diesel::migrate_url(&db.url, &db.schema)
        .await
        .unwrap();
    assert!(via_url.is_empty(), "{via_url:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_apply_once_without_error() {
    let db = reserve("migrate_concurrent");
    assert_eq!(
        db.regclass(&format!("\"{}\".outbox_events", db.schema)),
        None
    );
    let start = Arc::new(tokio::sync::Barrier::new(4));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = db.url.clone();
        let name = db.schema.clone();
        let start = Arc::clone(&start);
        tasks.push(tokio::spawn(async move {
            let mut conn = outbox_diesel::connect(&url).await.unwrap();
            start.wait().await;
            outbox_diesel::migrate(&mut conn, &name).await
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap().expect("no instance fails"));
    }
    results.sort();
    assert_eq!(
        results,
        vec![vec![], vec![], vec![], vec![1, 2, 3, 4, 5]],
        "exactly one instance applies the migration"
    );
    assert_eq!(db.count("outbox_schema_version", ""), 5);
    assert_eq!(db.count("outbox_settings", ""), 1);
    assert_outbox_works(&db.url, &db.schema).await;
}

#[tokio::test]
async fn diesel_migration_table_is_never_created() {
    let db = reserve("migrate_no_diesel");
    let public_before = db.regclass("public.__diesel_schema_migrations");
    let mut conn = outbox_diesel::connect(&db.url).await.unwrap();
    assert_eq!(
        outbox_diesel::migrate(&mut conn, &db.schema).await.unwrap(),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(
        db.regclass(&format!("\"{}\".__diesel_schema_migrations", db.schema)),
        None
    );
    assert_eq!(
        db.regclass("public.__diesel_schema_migrations"),
        public_before,
        "the user's diesel history is left as it was"
    );
    assert_eq!(
        db.regclass(&format!("\"{}\".outbox_schema_version", db.schema)),
        Some(format!("{}.outbox_schema_version", db.schema))
    );
}

#[tokio::test]
async fn ddl_applied_by_hand_gives_a_working_outbox() {
    let db = reserve("migrate_ddl");
    let ddl = outbox_diesel::ddl(&db.schema).unwrap();
    let mut conn = outbox_diesel::connect(&db.url).await.unwrap();
    conn.batch_execute(&ddl).await.unwrap();
    assert_eq!(
        db.tables(),
        TABLES,
        "the DDL carries the version bookkeeping"
    );
    assert_outbox_works(&db.url, &db.schema).await;
    // A team that started with the DDL can switch to `migrate` later.
    assert_eq!(
        outbox_diesel::migrate(&mut conn, &db.schema).await.unwrap(),
        Vec::<i32>::new(),
        "nothing to redo after the hand-applied DDL"
    );
    let inbox = outbox_diesel::PgInbox::new(&db.schema).unwrap();
    let event_id = uuid::Uuid::now_v7();
    let outcome = conn
        .transaction::<_, Error, _>(async |conn| {
            outbox_core::InboxStore::receive(&inbox, conn, "c", event_id).await
        })
        .await
        .unwrap();
    assert_eq!(outcome, outbox_core::InboxOutcome::FirstTime);
}
