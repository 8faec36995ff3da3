//! Migrations: once, idempotent, concurrent, WAL mode, never inside a
//! transaction.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use outbox_diesel::Error;
use outbox_diesel::sqlite::{self, SQLITE_MIGRATIONS, SqliteSettings};

use super::{TempDb, count};

const TABLES: [&str; 8] = [
    "outbox_events",
    "inbox_events",
    "outbox_settings",
    "outbox_attempts",
    "outbox_audit",
    "outbox_relays",
    "inbox_dead_letters",
    "outbox_schema_version",
];

#[tokio::test(flavor = "multi_thread")]
async fn migrating_twice_applies_once() {
    let db = TempDb::new("twice");
    let mut conn = sqlite::connect(&db.url()).await.unwrap();
    let all: Vec<i32> = SQLITE_MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(sqlite::migrate(&mut conn).await.unwrap(), all);
    assert_eq!(
        SqliteSettings::default().migrate(&mut conn).await.unwrap(),
        Vec::<i32>::new()
    );
    for table in TABLES {
        assert_eq!(
            count(
                &mut conn,
                &format!(
                    "SELECT count(*) AS n FROM sqlite_schema WHERE type = 'table' AND name = '{table}'"
                )
            )
            .await,
            1,
            "{table}"
        );
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_settings").await,
        1
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_schema_version").await,
        1
    );
}

#[derive(QueryableByName)]
struct Mode {
    #[diesel(sql_type = Text)]
    journal_mode: String,
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_puts_the_file_in_wal_mode() {
    let db = TempDb::new("wal");
    sqlite::migrate_url(&db.url()).await.unwrap();
    // A new connection reads the mode from the file.
    let mut conn = sqlite::connect(&db.url()).await.unwrap();
    let mode: Mode = diesel::sql_query("PRAGMA journal_mode")
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(mode.journal_mode, "wal");
}

/// Instances starting together on a new file: one migrates, the others
/// wait for its write lock and find nothing to do. (Switching the file to
/// WAL mode does not wait for locks by itself: without `migrate`'s retry,
/// about half the runs of this test failed with "database is locked".)
#[tokio::test(flavor = "multi_thread")]
async fn instances_starting_together_migrate_once() {
    for _ in 0..10 {
        let db = TempDb::new("together");
        let runs: Vec<_> = (0..6)
            .map(|_| {
                let url = db.url();
                tokio::spawn(async move { sqlite::migrate_url(&url).await })
            })
            .collect();
        let mut applied = Vec::new();
        for run in runs {
            applied.extend(run.await.unwrap().unwrap());
        }
        let all: Vec<i32> = SQLITE_MIGRATIONS.iter().map(|m| m.version).collect();
        assert_eq!(
            applied, all,
            "each migration applied by exactly one instance"
        );
        let mut conn = sqlite::connect(&db.url()).await.unwrap();
        assert_eq!(
            count(&mut conn, "SELECT count(*) AS n FROM outbox_settings").await,
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn migrating_inside_a_transaction_is_refused() {
    let db = TempDb::new("intx");
    let mut conn = sqlite::connect(&db.url()).await.unwrap();
    outbox_diesel::begin_top_level(&mut conn).await.unwrap();
    let error = sqlite::migrate(&mut conn).await.unwrap_err();
    assert!(
        matches!(&error, Error::Config(reason) if reason.contains("outside any transaction")),
        "{error}"
    );
}

/// A new database file is created readable by its owner only (it holds
/// every payload); a `sqlite://` URL's query is SQLite's (not part of the
/// file name); a database in memory is refused for a pool.
#[tokio::test(flavor = "multi_thread")]
async fn database_files_are_private_and_urls_are_sqlite_uris() {
    let db = super::TempDb::new("private");
    let url = format!("{}?mode=rwc", db.url());
    let mut conn = outbox_diesel::sqlite::connect(&url).await.unwrap();
    outbox_diesel::sqlite::migrate(&mut conn).await.unwrap();
    let path = db.url().trim_start_matches("sqlite://").to_owned();
    let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
    assert!(
        !std::path::Path::new(&format!("{path}?mode=rwc")).exists(),
        "the query is not part of the file name"
    );
    let Err(error) = outbox_diesel::sqlite::pool("sqlite::memory:", 2) else {
        panic!("a pool of databases in memory was built");
    };
    assert!(error.to_string().contains("in memory"), "{error}");
    assert!(outbox_diesel::sqlite::pool("file:m?mode=memory&cache=shared", 2).is_ok());
}
