//! The built `outbox` binary on MariaDB (`mysql://…`) and SQLite
//! (`sqlite://path`): the back end comes from `DATABASE_URL`'s scheme, and
//! the verbs an operator relies on (migrate, status, events, failure
//! groups, replay with its audit row, relays, purge) act on that database.
//! PostgreSQL's own tests are in `cli.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use assert_cmd::Command;
use outbox_core::testing::{TestEvent, fail_claimed};
use outbox_core::{Claim as _, NextStep, OutboxStore};
use outbox_diesel::{AsConnection, Connection as _, begin_top_level, commit_top_level};
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names;
use outbox_testkit::sqlite::TestSqliteFile;
use outbox_testkit::urls::mysql_url;
use predicates::prelude::*;
use serde_json::Value;
use uuid::Uuid;

/// The `outbox` binary on `url`, without a terminal or colour.
fn outbox(url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox"));
    cmd.env("DATABASE_URL", url)
        .env("NO_COLOR", "1")
        .env_remove("OUTBOX_SCHEMA")
        .env_remove("AMQP_URL");
    cmd
}

/// Runs `args` with `--json` on `url`, expects exit 0, parses stdout.
fn json(url: &str, args: &[&str]) -> Value {
    let output = outbox(url).arg("--json").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "outbox {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Three `piece.moved` events (aggregates a, a, b) committed on `conn`.
async fn record_three<A: AsConnection>(conn: &mut A) -> Vec<Uuid> {
    let events: Vec<TestEvent> = ["a", "a", "b"]
        .iter()
        .enumerate()
        .map(|(n, a)| {
            TestEvent::new(*a)
                .of_type("piece", "piece.moved")
                .field("n", n)
        })
        .collect();
    begin_top_level(conn).await.unwrap();
    let ids = conn.as_connection().record_events(&events).await.unwrap();
    commit_top_level(conn).await.unwrap();
    ids
}

/// The verbs on a database the CLI has just migrated, holding the three
/// events of [`record_three`] made dead through `store` (which keeps sent
/// events).
async fn operate(url: &str, store: impl OutboxStore, ids: &[Uuid]) {
    fail_claimed(&store, ids, 5, NextStep::Dead, |id| {
        format!("NOT_FOUND - no exchange ({id})")
    })
    .await
    .unwrap();

    let status = json(url, &["status"]);
    assert_eq!(status["counts"]["dead"], 3, "{status}");
    assert_eq!(status["counts"]["pending"], 0, "{status}");

    let page = json(url, &["events", "list", "--status", "dead", "--limit", "2"]);
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{page}");
    assert_eq!(items[0]["id"], ids[0].to_string());
    let next = page["next"].as_i64().expect("a next page").to_string();
    let rest = json(
        url,
        &["events", "list", "--status", "dead", "--after", &next],
    );
    assert_eq!(rest["items"][0]["id"], ids[2].to_string(), "{rest}");

    let shown = json(url, &["events", "show", &ids[0].to_string(), "--payload"]);
    assert_eq!(shown["status"], "dead");
    assert_eq!(shown["history"][0]["outcome"], "dead", "{shown}");
    assert_eq!(shown["payload"]["aggregate"], "a", "{shown}");

    let groups = json(url, &["dead", "groups"]);
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 1, "one error, ids stripped: {groups:?}");
    assert_eq!(groups[0]["dead"], 3, "{groups:?}");

    // A dry run changes nothing; the real one needs --yes, replays all
    // three and writes its audit row.
    let dry = json(url, &["replay", "--all-dead", "--dry-run"]);
    assert_eq!(
        (&dry["matched"], &dry["changed"]),
        (&3.into(), &0.into()),
        "{dry}"
    );
    assert_eq!(json(url, &["status"])["counts"]["dead"], 3);
    outbox(url)
        .args(["replay", "--all-dead"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--yes"));
    let replayed = json(url, &["replay", "--all-dead", "--yes"]);
    assert_eq!(replayed["changed"], 3, "{replayed}");
    let status = json(url, &["status"]);
    assert_eq!(status["counts"]["dead"], 0, "{status}");
    assert_eq!(status["counts"]["pending"], 3, "{status}");
    let audit = json(url, &["audit"]);
    assert_eq!(audit[0]["action"], "replay", "{audit}");
    assert_eq!(audit[0]["count"], 3, "{audit}");

    assert_eq!(json(url, &["relays", "list"]), Value::Array(Vec::new()));

    // Delivered (kept as `sent`), then purged once older than a second.
    let mut claim = store.claim(10).await.unwrap().expect("the replayed events");
    let seqs: Vec<i64> = claim.records().iter().map(|r| r.seq).collect();
    assert_eq!(seqs.len(), 3);
    claim.mark_sent(&seqs).await.unwrap();
    claim.finish().await.unwrap();
    assert_eq!(json(url, &["status"])["counts"]["sent"], 3);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let purged = json(url, &["purge", "sent", "--older-than", "1s", "--yes"]);
    assert_eq!(purged["changed"], 3, "{purged}");
    assert_eq!(json(url, &["status"])["counts"]["sent"], 0);

    // PostgreSQL's plan only.
    outbox(url)
        .arg("explain-claim")
        .assert()
        .failure()
        .stderr(predicate::str::contains("PostgreSQL"));
    // PostgreSQL's schema and contract phase are refused, not ignored: a
    // mutation must not act on another outbox than the one named.
    outbox(url)
        .args(["--schema", "billing", "replay", "--all-dead", "--yes"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--schema"));
    outbox(url)
        .args(["migrate", "--contract"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("contract"));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_verb_works_on_mariadb() {
    let db = TestMysqlDatabase::create(&mysql_url(), names::unique("t_cli", "mariadb")).await;
    let url = db.url();
    outbox(url)
        .arg("migrate")
        .assert()
        .success()
        .stdout(predicate::str::contains("applied migration(s) 1"));
    outbox(url)
        .arg("migrate")
        .assert()
        .success()
        .stdout(predicate::str::contains("up to date"));
    let mut conn = outbox_diesel::mysql::connect(url).await.unwrap();
    let ids = record_three(&mut conn).await;
    let store = outbox_diesel::mysql::MysqlSettings::default()
        .store(outbox_diesel::mysql::pool(url, 2).unwrap())
        .keep_sent(true);
    operate(url, store, &ids).await;
    outbox(url)
        .arg("ddl")
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "CREATE TABLE IF NOT EXISTS outbox_events",
        ));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_verb_works_on_sqlite() {
    let file = TestSqliteFile::new(env!("CARGO_TARGET_TMPDIR"), "t_cli", "sqlite");
    let url = file.url();
    outbox(&url)
        .arg("migrate")
        .assert()
        .success()
        .stdout(predicate::str::contains("applied migration(s) 1"));
    outbox(&url)
        .arg("migrate")
        .assert()
        .success()
        .stdout(predicate::str::contains("up to date"));
    let mut conn = outbox_diesel::sqlite::connect(&url).await.unwrap();
    let ids = record_three(&mut conn).await;
    let store = outbox_diesel::sqlite::SqliteSettings::default()
        .store(outbox_diesel::sqlite::pool(&url, 2).unwrap())
        .keep_sent(true);
    operate(&url, store, &ids).await;
}

#[test]
fn an_unknown_scheme_is_refused_without_the_password() {
    outbox("redis://user:s3cret@127.0.0.1/0")
        .arg("status")
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("postgres://…, mysql://… or sqlite://path")
                .and(predicate::str::contains("s3cret").not()),
        );
}

#[test]
fn a_mistyped_sqlite_path_is_refused_and_no_file_is_created() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let missing = dir.join(format!("t_cli_missing_{}.db", Uuid::now_v7().simple()));
    outbox(&format!("sqlite://{}", missing.display()))
        .arg("status")
        .assert()
        .code(4)
        .stderr(
            predicate::str::contains("no SQLite database at")
                .and(predicate::str::contains(missing.display().to_string())),
        );
    assert!(
        !missing.exists(),
        "a read-only verb created {}",
        missing.display()
    );
}
