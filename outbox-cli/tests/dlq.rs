//! `outbox dlq` against the real PostgreSQL and RabbitMQ: listing reads the
//! database and leaves the queue alone, replay moves dead letters back to
//! their queue and marks them, a replay killed half way loses nothing, a
//! replay that cannot go on says so (exit 7), purge empties the queue.
//!
//! Each test has its own schema and its own queues, deleted when it ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::process::Stdio;

use common::TestDb;
use common::broker::{Queues, amqp_url};
use predicates::prelude::*;
use serde_json::Value;

const CONSUMER: &str = "billing";

/// A migrated schema, the queues and `n` dead letters in both the
/// dead-letter queue and the database.
async fn setup(test: &str, n: usize) -> (TestDb, Queues, Vec<uuid::Uuid>) {
    let db = TestDb::new(test).await;
    let queues = Queues::new(test).await;
    let ids = queues.dead_letter(n, &queues.origin).await;
    db.record_dead_letters(CONSUMER, &queues.origin, &ids).await;
    (db, queues, ids)
}

fn event_ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_id"].as_str().unwrap().to_owned())
        .collect()
}

fn strings(ids: &[uuid::Uuid]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}

#[tokio::test]
async fn dlq_list_shows_dead_letters_in_order_from_the_database_and_leaves_the_queue_alone() {
    let (db, queues, ids) = setup("dlq_list", 3).await;
    let before = queues.peek(&queues.dlq).await;

    let page = db.json(&["dlq", "list", &queues.origin]);
    assert_eq!(event_ids(&page), strings(&ids));
    assert_eq!(page["items"][0]["consumer"], CONSUMER);
    assert_eq!(page["next"], Value::Null);
    let first = db.json(&["dlq", "list", "--limit", "2"]);
    assert_eq!(event_ids(&first), strings(&ids[..2]));
    let next = first["next"].as_i64().expect("a next page").to_string();
    let rest = db.json(&["dlq", "list", "--after", &next]);
    assert_eq!(event_ids(&rest), strings(&ids[2..]));
    let other = db.json(&["dlq", "list", "some.other.queue"]);
    assert!(other["items"].as_array().unwrap().is_empty());

    db.outbox().args(["dlq", "list"]).assert().success().stdout(
        predicate::str::contains("REASON")
            .and(predicate::str::contains(ids[2].to_string()))
            .and(predicate::str::contains("open")),
    );
    let id = page["items"][1]["id"].as_i64().unwrap().to_string();
    let shown = db.json(&["dlq", "show", &id]);
    assert_eq!(shown["event_id"], ids[1].to_string());
    assert_eq!(shown["payload"], "{\"n\":1}");
    db.outbox()
        .args(["dlq", "show", &id])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("row 1 missing").and(predicate::str::contains("payload:")),
        );
    db.outbox().args(["dlq", "show", "999999"]).assert().code(3);
    let groups = db.json(&["dlq", "groups"]);
    assert_eq!(groups[0]["count"], 3);
    assert_eq!(groups[0]["reason"], "row <n> missing");

    // Listing never touched the broker: same messages, same order.
    assert_eq!(queues.peek(&queues.dlq).await, before);
    assert_eq!(before, strings(&ids));
}

#[tokio::test]
async fn dlq_replay_sends_them_back_to_their_queue_and_marks_them_replayed() {
    let (db, queues, ids) = setup("dlq_replay", 3).await;
    let url = amqp_url();

    let dry = db.json(&[
        "--amqp-url",
        &url,
        "dlq",
        "replay",
        &queues.dlq,
        "--dry-run",
    ]);
    assert_eq!(dry["depth"], 3);
    assert_eq!(queues.depth(&queues.dlq).await, 3);
    assert_eq!(queues.depth(&queues.origin).await, 0);

    let one = db.json(&[
        "--amqp-url",
        &url,
        "dlq",
        "replay",
        &queues.dlq,
        "--limit",
        "1",
    ]);
    assert_eq!(one["replayed"], 1);
    assert_eq!(one["marked"], 1);
    db.outbox()
        .args(["--amqp-url", &url, "dlq", "replay", &queues.dlq])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--yes"));
    assert_eq!(
        queues.depth(&queues.dlq).await,
        2,
        "nothing moved without --yes"
    );
    let rest = db.json(&["--amqp-url", &url, "--yes", "dlq", "replay", &queues.dlq]);
    assert_eq!(rest["replayed"], 2);
    assert_eq!(rest["marked"], 2);
    assert_eq!(rest["error"], Value::Null);
    assert!(rest["audit_id"].is_i64());

    assert_eq!(queues.depth(&queues.dlq).await, 0);
    assert_eq!(queues.drain(&queues.origin).await, strings(&ids));
    let open = db.json(&["dlq", "list"]);
    assert!(open["items"].as_array().unwrap().is_empty());
    let all = db.json(&["dlq", "list", "--all"]);
    assert_eq!(event_ids(&all), strings(&ids));
    assert!(all["items"][2]["replayed_at"].is_string());
    let audit = db.json(&["audit"]);
    assert_eq!(audit[0]["action"], "dlq_replay");
    assert_eq!(audit[0]["count"], 2);
    assert_eq!(
        audit[0]["outcome"],
        "done: 2 replayed, 0 skipped, 2 record(s) marked"
    );
}

#[tokio::test]
async fn dlq_replay_that_cannot_go_on_exits_7_and_leaves_the_rest_in_the_queue() {
    let db = TestDb::new("dlq_stop").await;
    let queues = Queues::new("dlq_stop").await;
    let good = queues.dead_letter(1, &queues.origin).await;
    let gone = format!("{}.gone", queues.origin);
    let lost = queues.dead_letter(2, &gone).await;
    db.record_dead_letters(CONSUMER, &queues.origin, &good)
        .await;

    db.outbox()
        .args([
            "--amqp-url",
            &amqp_url(),
            "--yes",
            "dlq",
            "replay",
            &queues.dlq,
        ])
        .assert()
        .code(7)
        .stdout(predicate::str::contains("1 message(s)"))
        .stderr(
            predicate::str::contains("stopped after 1 message(s)")
                .and(predicate::str::contains("Nothing was lost")),
        );
    assert_eq!(queues.depth(&queues.origin).await, 1);
    assert_eq!(queues.peek(&queues.dlq).await, strings(&lost));
    assert!(
        db.json(&["dlq", "list"])["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Told to skip what cannot go back, it moves those to the tail (in
    // their order) and succeeds; nothing is lost or replayed twice.
    let skipped = db.json(&[
        "--amqp-url",
        &amqp_url(),
        "--yes",
        "dlq",
        "replay",
        &queues.dlq,
        "--skip-unreplayable",
    ]);
    assert_eq!(skipped["replayed"], 0, "{skipped}");
    assert_eq!(skipped["skipped"].as_array().unwrap().len(), 2, "{skipped}");
    assert!(
        skipped["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains(".gone"),
        "{skipped}"
    );
    assert_eq!(skipped["error"], Value::Null);
    assert_eq!(queues.peek(&queues.dlq).await, strings(&lost));
    assert_eq!(queues.depth(&queues.origin).await, 1);
}

#[tokio::test]
async fn dlq_without_a_broker_says_what_is_missing() {
    let db = TestDb::new("dlq_nobroker").await;
    db.outbox()
        .args(["dlq", "replay", "billing.orders.dead"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("AMQP_URL"));
    // A list of no URLs is missing too, not a broker failure.
    for empty in [",", " , ,"] {
        db.outbox()
            .env("AMQP_URL", empty)
            .args(["dlq", "replay", "billing.orders.dead"])
            .assert()
            .code(4)
            .stderr(predicate::str::contains("AMQP_URL"));
    }
    db.outbox()
        .args(["--amqp-url", "amqp://guest:guest@127.0.0.1:1/%2f"])
        .args(["dlq", "purge", "billing.orders.dead", "--yes"])
        .assert()
        .code(6)
        .stderr(
            predicate::str::contains("127.0.0.1:1")
                .and(predicate::str::contains("guest:guest").not()),
        );
    db.outbox()
        .args([
            "--amqp-url",
            &amqp_url(),
            "dlq",
            "purge",
            "orders-dlq",
            "--yes",
        ])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--origin"));
}

#[tokio::test]
async fn dlq_purge_needs_yes_then_empties_the_queue_and_marks_the_records() {
    let (db, queues, ids) = setup("dlq_purge", 3).await;
    let url = amqp_url();

    db.outbox()
        .args(["--amqp-url", &url, "dlq", "purge", &queues.dlq])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("--yes"));
    assert_eq!(queues.depth(&queues.dlq).await, 3);

    let purged = db.json(&["--amqp-url", &url, "dlq", "purge", &queues.dlq, "--yes"]);
    assert_eq!(purged["purged"], 3);
    assert_eq!(purged["marked"], 3);
    assert_eq!(purged["origins"], serde_json::json!([queues.origin]));
    assert_eq!(queues.depth(&queues.dlq).await, 0);
    assert!(
        db.json(&["dlq", "list"])["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let all = db.json(&["dlq", "list", "--all"]);
    assert_eq!(event_ids(&all), strings(&ids));
    assert!(all["items"][0]["purged_at"].is_string());
    assert_eq!(db.json(&["audit"])[0]["action"], "dlq_purge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_killed_half_way_loses_nothing_and_a_second_replay_finishes() {
    const N: u32 = 2_000;
    let db = TestDb::new("dlq_kill").await;
    let queues = Queues::new("dlq_kill").await;
    let ids = queues.dead_letter(N as usize, &queues.origin).await;
    db.record_dead_letters(CONSUMER, &queues.origin, &ids).await;
    let url = amqp_url();
    let open = |db: &TestDb| {
        let page = db.json(&["dlq", "list", "--limit", "10000"]);
        page["items"].as_array().unwrap().len() as u32
    };

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env("DATABASE_URL", &db.url)
        .env("OUTBOX_SCHEMA", &db.schema)
        .env("AMQP_URL", &url)
        .args(["--chunk-size", "100", "--yes", "dlq", "replay", &queues.dlq])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    queues
        .wait_for("a few hundred replayed", |origin, _| origin >= 300)
        .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // Its unacked message goes back when the broker sees the connection go.
    let (origin, dlq) = queues
        .wait_for("every message back in a queue", |o, d| o + d >= N)
        .await;
    assert!(origin < N, "killed half way: {origin} of {N} already moved");
    let mut seen: HashSet<String> = queues.peek(&queues.origin).await.into_iter().collect();
    seen.extend(queues.peek(&queues.dlq).await);
    for id in &ids {
        assert!(
            seen.contains(&id.to_string()),
            "{id} lost ({origin} + {dlq})"
        );
    }

    db.outbox()
        .args(["--amqp-url", &url, "--yes", "dlq", "replay", &queues.dlq])
        .assert()
        .success();
    assert_eq!(queues.depth(&queues.dlq).await, 0);
    let moved: HashSet<String> = queues.drain(&queues.origin).await.into_iter().collect();
    assert!(moved.len() >= N as usize);
    for id in &ids {
        assert!(moved.contains(&id.to_string()), "{id} not replayed");
    }
    // Only the killed run's last chunk can be left open in the database.
    assert!(open(&db) <= 100, "{} still open", open(&db));
}
