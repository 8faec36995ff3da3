//! Migrations: once, idempotent, concurrent, in a named database, never
//! inside a transaction.

use diesel_async::{AnsiTransactionManager, TransactionManager};
use outbox_diesel::Error;
use outbox_diesel::mysql::{self, MYSQL_MIGRATIONS, MysqlSettings};
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names::unique;
use outbox_testkit::urls::mysql_url;

use super::count;

#[tokio::test]
async fn migrating_twice_applies_once() {
    let db = TestMysqlDatabase::create(&mysql_url(), unique("my", "twice")).await;
    let mut conn = mysql::connect(db.url()).await.unwrap();
    let all: Vec<i32> = MYSQL_MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(mysql::migrate(&mut conn).await.unwrap(), all);
    assert_eq!(mysql::migrate(&mut conn).await.unwrap(), Vec::<i32>::new());
    for table in [
        "outbox_events",
        "inbox_events",
        "outbox_settings",
        "outbox_attempts",
        "outbox_audit",
        "outbox_relays",
        "inbox_dead_letters",
    ] {
        assert_eq!(
            count(
                &mut conn,
                &format!(
                    "SELECT COUNT(*) AS n FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = '{}' AND TABLE_NAME = '{table}'",
                    db.name()
                )
            )
            .await,
            1,
            "{table}"
        );
    }
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_settings").await,
        1
    );
}

#[tokio::test]
async fn instances_starting_together_migrate_once() {
    let db = TestMysqlDatabase::create(&mysql_url(), unique("my", "together")).await;
    let runs = (0..4).map(|_| {
        let url = db.url().to_owned();
        tokio::spawn(async move { mysql::migrate_url(&url).await })
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap().unwrap());
    }
    let all: Vec<i32> = MYSQL_MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(
        applied, all,
        "each migration applied by exactly one instance"
    );
    let mut conn = mysql::connect(db.url()).await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_settings").await,
        1
    );
}

/// A migration killed after some of its steps (DDL commits each one) is
/// finished by the next run: every step can run again.
#[tokio::test]
async fn a_migration_cut_short_is_finished_by_the_next_run() {
    let db = TestMysqlDatabase::create(&mysql_url(), unique("my", "cut")).await;
    let mut conn = mysql::connect(db.url()).await.unwrap();
    // The steps of migration 1 up to the inbox, as a killed run leaves them.
    let sql = MYSQL_MIGRATIONS[0].sql.replace("{schema}", "");
    let cut = &sql[..sql
        .find("CREATE TABLE IF NOT EXISTS outbox_attempts")
        .unwrap()];
    for step in cut.split("-- step:") {
        let body: String = step
            .lines()
            .skip(1)
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        if !body.trim().is_empty() {
            diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, &body)
                .await
                .unwrap();
        }
    }
    assert_eq!(mysql::migrate(&mut conn).await.unwrap(), vec![1]);
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_settings").await,
        1
    );
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_attempts").await,
        0
    );
}

#[tokio::test]
async fn a_named_database_is_migrated_whatever_the_connection_uses() {
    let home = TestMysqlDatabase::create(&mysql_url(), unique("my", "home")).await;
    let other = TestMysqlDatabase::create(&mysql_url(), unique("my", "other")).await;
    let mut conn = mysql::connect(home.url()).await.unwrap();
    let settings = MysqlSettings::new(other.name()).unwrap();
    assert_eq!(settings.migrate(&mut conn).await.unwrap(), vec![1]);
    let in_other = format!(
        "SELECT COUNT(*) AS n FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = '{}' AND TABLE_NAME = 'outbox_events'",
        other.name()
    );
    assert_eq!(count(&mut conn, &in_other).await, 1);
    let in_home = in_other.replace(other.name(), home.name());
    assert_eq!(count(&mut conn, &in_home).await, 0);
}

#[tokio::test]
async fn migrating_inside_a_transaction_is_refused() {
    let db = TestMysqlDatabase::create(&mysql_url(), unique("my", "intx")).await;
    let mut conn = mysql::connect(db.url()).await.unwrap();
    AnsiTransactionManager::begin_transaction(&mut conn)
        .await
        .unwrap();
    let error = mysql::migrate(&mut conn).await.unwrap_err();
    assert!(
        matches!(&error, Error::Config(reason) if reason.contains("outside any transaction")),
        "{error}"
    );
}

#[tokio::test]
async fn a_connection_without_a_database_is_told_to_name_one() {
    let url = mysql_url();
    let server = &url[..url.rfind('/').unwrap()];
    let mut conn = mysql::connect(server).await.unwrap();
    let error = mysql::migrate(&mut conn).await.unwrap_err();
    assert!(error.to_string().contains("no database"), "{error}");
}
