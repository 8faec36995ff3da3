//! The built `outbox` binary against the real PostgreSQL: each verb's
//! output, its effect on the outbox, and the exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestDb;
use outbox_core::{NextStep, OutboxStore as _, RelayRegistration};
use predicates::prelude::*;
use serde_json::Value;

/// Three events (a, a, b), all dead.
async fn three_dead(db: &TestDb) -> Vec<uuid::Uuid> {
    let ids = db.record(&["a", "a", "b"]).await;
    db.fail(&ids, "NOT_FOUND - no exchange", NextStep::Dead)
        .await;
    ids
}

/// `--no-prepared-statements` (or its environment variable) reaches the
/// store: reads and a chunked mutation work, with the same answers.
#[tokio::test]
async fn without_prepared_statements_reads_and_mutations_give_the_same_answers() {
    let db = TestDb::new("unprepared").await;
    let ids = db.record(&["a", "b", "c"]).await;
    db.fail(&ids[..2], "nack", NextStep::Dead).await;

    let prepared = db.json(&["status"]);
    let unprepared = db.json(&["--no-prepared-statements", "status"]);
    assert_eq!(unprepared["counts"], prepared["counts"]);
    assert_eq!(unprepared["counts"]["dead"], 2);

    db.outbox()
        .env("OUTBOX_NO_PREPARED_STATEMENTS", "1")
        .args(["replay", "--all-dead", "--yes"])
        .assert()
        .success();
    let after = db.json(&["--no-prepared-statements", "status"]);
    assert_eq!(after["counts"]["dead"], 0);
    assert_eq!(after["counts"]["pending"], 3);

    db.outbox()
        .env("OUTBOX_NO_PREPARED_STATEMENTS", "maybe")
        .arg("status")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no-prepared-statements"));
}

#[tokio::test]
async fn status_json_counts_events_per_status() {
    let db = TestDb::new("status").await;
    let ids = db.record(&["a", "b", "c"]).await;
    db.fail(&ids[..2], "nack", NextStep::Dead).await;

    let status = db.json(&["status"]);
    assert_eq!(status["counts"]["dead"], 2);
    assert_eq!(status["counts"]["pending"], 1);
    assert_eq!(status["delivery_order"], "per_aggregate");

    db.outbox().arg("status").assert().success().stdout(
        predicate::str::contains("STATUS")
            .and(predicate::str::contains("dead"))
            .and(predicate::str::contains("\u{1b}[").not()),
    );
}

#[tokio::test]
async fn events_list_pages_dead_events_with_a_cursor_and_prints_a_table() {
    let db = TestDb::new("list").await;
    let ids = three_dead(&db).await;

    let first = db.json(&["events", "list", "--status", "dead", "--limit", "2"]);
    let items = first["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["id"], ids[0].to_string());
    let next = first["next"].as_i64().expect("a next page");
    let rest = db.json(&[
        "events",
        "list",
        "--status",
        "dead",
        "--limit",
        "2",
        "--after",
        &next.to_string(),
    ]);
    assert_eq!(rest["items"].as_array().unwrap().len(), 1);
    assert_eq!(rest["items"][0]["id"], ids[2].to_string());
    assert_eq!(rest["next"], Value::Null);

    let pending = db.json(&["events", "list", "--status", "pending"]);
    assert!(pending["items"].as_array().unwrap().is_empty());

    db.outbox()
        .args(["events", "list", "--aggregate", "piece:a", "--limit", "1"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("EVENT TYPE")
                .and(predicate::str::contains(ids[0].to_string()))
                .and(predicate::str::contains(ids[1].to_string()).not())
                .and(predicate::str::contains("next page: --after")),
        );
}

#[tokio::test]
async fn events_show_prints_the_history_and_the_payload_only_when_asked() {
    let db = TestDb::new("show").await;
    let ids = three_dead(&db).await;
    let id = ids[0].to_string();

    let hidden = db.json(&["events", "show", &id]);
    assert_eq!(hidden["status"], "dead");
    assert_eq!(hidden["payload"], Value::Null);
    assert_eq!(hidden["history"][0]["outcome"], "dead");
    let shown = db.json(&["events", "show", &id, "--payload"]);
    assert_eq!(shown["payload"]["aggregate"], "a");

    db.outbox()
        .args(["events", "show", &id])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("piece.moved")
                .and(predicate::str::contains("NOT_FOUND - no exchange"))
                .and(predicate::str::contains("payload:").not()),
        );
    db.outbox()
        .args(["events", "show", "00000000-0000-0000-0000-000000000000"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("no outbox event"));
}

#[tokio::test]
async fn dead_groups_groups_by_normalized_error() {
    let db = TestDb::new("groups").await;
    three_dead(&db).await;

    let groups = db.json(&["dead", "groups"]);
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["dead"], 3);
    assert_eq!(groups[0]["error"], "NOT_FOUND - no exchange (<id>)");
    let group = groups[0]["id"].as_str().unwrap();

    db.outbox()
        .args(["dead", "groups"])
        .assert()
        .success()
        .stdout(predicate::str::contains("GROUP").and(predicate::str::contains(group)));
    let by_group = db.json(&["events", "list", "--group", group]);
    assert_eq!(by_group["items"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn replay_keeps_each_aggregates_order() {
    let db = TestDb::new("replay_order").await;
    let ids = three_dead(&db).await;

    let later = db.json(&["replay", "--id", &ids[1].to_string()]);
    assert_eq!(
        (later["matched"].as_u64(), later["changed"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(
        db.claimable().await.is_empty(),
        "the later event waits behind the earlier dead one"
    );

    db.outbox()
        .args(["replay", "--aggregate", "piece:a", "--yes"])
        .assert()
        .success()
        .stdout(predicate::str::contains("replay: 1 of 1 selected changed"));
    assert_eq!(
        db.claimable().await,
        [ids[0], ids[1]],
        "both, in order; b is still dead"
    );

    let audit = db.json(&["audit"]);
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["replay", "replay"]);
    assert!(audit[0]["identity"].as_str().unwrap().starts_with("cli:"));
}

#[tokio::test]
async fn replay_all_dead_dry_run_counts_and_changes_nothing_and_a_real_one_needs_yes() {
    let db = TestDb::new("replay_dry").await;
    three_dead(&db).await;

    let dry = db.json(&["replay", "--all-dead", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["matched"], 3);
    assert_eq!(dry["changed"], 0);
    assert_eq!(db.json(&["status"])["counts"]["dead"], 3);

    db.outbox()
        .args(["replay", "--all-dead"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--yes"));
    assert_eq!(
        db.json(&["status"])["counts"]["dead"],
        3,
        "refused: nothing changed"
    );

    let done = db.json(&["replay", "--all-dead", "--yes", "--as", "alice"]);
    assert_eq!(done["changed"], 3);
    assert_eq!(db.json(&["status"])["counts"]["dead"], 0);
    assert_eq!(db.json(&["audit"])[0]["identity"], "alice");
}

#[tokio::test]
async fn skip_head_releases_the_aggregate() {
    let db = TestDb::new("skip_head").await;
    let ids = three_dead(&db).await;
    db.json(&["replay", "--id", &ids[1].to_string()]);

    let dry = db.json(&["skip", "--head", "piece:a", "--dry-run"]);
    assert_eq!(dry["matched"], 1);
    assert_eq!(
        db.json(&["events", "show", &ids[0].to_string()])["status"],
        "dead"
    );

    db.outbox()
        .args(["skip", "--head", "piece:a"])
        .assert()
        .success();
    assert_eq!(
        db.json(&["events", "show", &ids[0].to_string()])["status"],
        "skipped"
    );
    assert_eq!(
        db.claimable().await,
        [ids[1]],
        "the replayed later event is free"
    );

    db.outbox()
        .args(["skip", "--head", "piece:nothing"])
        .assert()
        .code(3);
}

#[tokio::test]
async fn purge_sent_deletes_old_sent_events_with_yes() {
    let db = TestDb::new("purge").await;
    let ids = db.record(&["a", "b", "c"]).await;
    {
        use outbox_core::Claim as _;
        let store = db.store();
        let mut claim = store.claim(10).await.unwrap().unwrap();
        let seqs: Vec<i64> = claim
            .records()
            .iter()
            .filter(|r| ids[..2].contains(&r.id()))
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs.len(), 2);
        claim.mark_sent(&seqs).await.unwrap();
        claim.finish().await.unwrap();
    }
    db.execute("UPDATE {schema}.outbox_events SET published_at = now() - interval '1 hour' WHERE published_at IS NOT NULL");

    db.outbox()
        .args(["purge", "sent", "--older-than", "1s"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--yes"));
    let dry = db.json(&["purge", "sent", "--older-than", "1s", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(db.count("outbox_events"), 3);

    let report = db.json(&["purge", "sent", "--older-than", "1s", "--yes"]);
    assert_eq!(report["changed"], 2);
    assert_eq!(db.count("outbox_events"), 1, "the pending event stays");
}

#[tokio::test]
async fn relays_pause_and_resume_through_the_registry() {
    let db = TestDb::new("relays").await;
    db.store()
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();

    let relays = db.json(&["relays", "list"]);
    assert_eq!(relays[0]["name"], "r1");
    assert_eq!(relays[0]["paused"], false);
    db.outbox()
        .args(["relays", "pause", "r1"])
        .assert()
        .success();
    assert_eq!(db.json(&["relays", "list"])[0]["paused"], true);
    db.outbox()
        .args(["relays", "resume", "r1"])
        .assert()
        .success();
    assert_eq!(db.json(&["relays", "list"])[0]["paused"], false);
    db.outbox()
        .args(["relays", "list"])
        .assert()
        .success()
        .stdout(predicate::str::contains("RELAY").and(predicate::str::contains("r1")));

    db.outbox()
        .args(["relays", "pause", "nobody"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("relays list"));
}

#[tokio::test]
async fn migrate_creates_a_fresh_schema_once() {
    let db = TestDb::unmigrated("migrate");
    let first = db.json(&["migrate"]);
    assert_eq!(first["applied"], serde_json::json!([1, 2, 3, 4, 5]));
    let again = db.json(&["migrate"]);
    assert_eq!(again["applied"], serde_json::json!([]));
    assert_eq!(db.count("outbox_events"), 0);
    db.outbox()
        .arg("migrate")
        .assert()
        .success()
        .stdout(predicate::str::contains("up to date"));
}

#[test]
fn ddl_prints_the_sql_for_the_schema_without_a_database() {
    let db = TestDb::unmigrated("ddl");
    db.outbox()
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .args(["--schema", "billing", "ddl"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("CREATE TABLE")
                .and(predicate::str::contains("\"billing\".outbox_events")),
        );
}

#[tokio::test]
async fn explain_claim_prints_a_plan() {
    let db = TestDb::new("explain").await;
    db.record(&["a"]).await;
    let plan = db.json(&["explain-claim", "--limit", "10"]);
    assert!(plan[0]["Plan"].is_object(), "{plan}");
}

#[tokio::test]
async fn replay_without_a_selection_is_invalid() {
    let db = TestDb::new("empty_selection").await;
    db.outbox()
        .arg("replay")
        .assert()
        .code(4)
        .stderr(predicate::str::contains("select the events"));
}

#[test]
fn an_unreachable_database_is_exit_code_5_without_the_password() {
    let db = TestDb::unmigrated("unreachable");
    db.outbox()
        .env("DATABASE_URL", "postgres://app:s3cret@127.0.0.1:1/shop")
        .arg("status")
        .assert()
        .code(5)
        .stderr(
            predicate::str::contains("scripts/dev-services")
                .and(predicate::str::contains("s3cret").not()),
        );
}

#[test]
fn usage_errors_are_exit_code_2_and_help_lists_exit_codes() {
    let db = TestDb::unmigrated("usage");
    db.outbox().args(["events", "frobnicate"]).assert().code(2);
    db.outbox().args(["skip"]).assert().code(2);
    db.outbox().arg("--help").assert().success().stdout(
        predicate::str::contains("Exit codes").and(predicate::str::contains("outbox replay")),
    );
}

#[tokio::test]
async fn retry_now_makes_waiting_retries_due() {
    let db = TestDb::new("retry_now").await;
    let ids = db.record(&["a", "b"]).await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    db.fail(&ids, "NO_ROUTE", NextStep::RetryAt(later)).await;
    assert!(db.claimable().await.is_empty(), "both wait an hour");

    db.outbox()
        .args(["retry-now", "--all"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--yes"));
    db.outbox()
        .args(["retry-now", "--status", "dead"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("not dead ones"));
    let one = db.json(&["retry-now", "--id", &ids[1].to_string()]);
    assert_eq!(one["changed"], 1);
    assert_eq!(db.claimable().await, [ids[1]]);
    let all = db.json(&["retry-now", "--all", "--yes"]);
    assert_eq!(
        all["changed"], 1,
        "the one still waiting; the other is due already"
    );
    assert_eq!(db.claimable().await, [ids[0], ids[1]]);
}

#[tokio::test]
async fn purge_inbox_deletes_old_entries() {
    let db = TestDb::new("purge_inbox").await;
    db.execute(
        "INSERT INTO {schema}.inbox_events (consumer, event_id, received_at) \
         SELECT 'c', gen_random_uuid(), now() - interval '20 days' FROM generate_series(1, 3)",
    );
    db.execute(
        "INSERT INTO {schema}.inbox_events (consumer, event_id) SELECT 'c', gen_random_uuid()",
    );
    let report = db.json(&["purge", "inbox", "--older-than", "14d", "--yes"]);
    assert_eq!(report["changed"], 3);
    assert_eq!(db.count("inbox_events"), 1);
    assert_eq!(db.json(&["audit"])[0]["action"], "purge_inbox");
}

#[tokio::test]
async fn events_list_filters_by_time() {
    let db = TestDb::new("since").await;
    let ids = db.record(&["a", "b"]).await;
    db.execute(&format!(
        "UPDATE {{schema}}.outbox_events SET occurred_at = now() - interval '2 days' WHERE id = '{}'",
        ids[0]
    ));
    let recent = db.json(&["events", "list", "--since", "1d"]);
    assert_eq!(recent["items"].as_array().unwrap().len(), 1);
    assert_eq!(recent["items"][0]["id"], ids[1].to_string());
    let old = db.json(&["events", "list", "--until", "1d"]);
    assert_eq!(old["items"][0]["id"], ids[0].to_string());
    db.outbox()
        .args(["events", "list", "--since", "yesterday-ish"])
        .assert()
        .code(2);
}
