//! The operations kit under `docs/ops/`: the Prometheus alert rules are
//! valid (`promtool check rules`), each alert fires on the series it should
//! and not otherwise (`promtool test rules docs/ops/alerts.test.yml`), and
//! every metric the rules and the Grafana dashboard use is one the example
//! service (`examples/ecommerce`, role `all`) really exports on `/metrics`.
//!
//! Needs `promtool` (Debian's `prometheus` package; `scripts/dev-services`
//! installs it, or set `PROMTOOL`), and PostgreSQL and RabbitMQ at
//! `DATABASE_URL` / `AMQP_URL` for the last test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use outbox_testkit::amqp::BrokerCleanup;
use outbox_testkit::names;
use outbox_testkit::net::free_port;
use outbox_testkit::pg::TestDatabase;
use outbox_testkit::urls::{amqp_url, database_url};
use outbox_tests::example_binary as binary;
use serde_json::{Value, json};
use uuid::Uuid;

/// How long the example may take to answer `/healthz`, and its metrics to
/// show what the traffic below makes it export.
const STARTUP: Duration = Duration::from_secs(30);

fn ops_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ops")
}

fn read(file: &str) -> String {
    let path = ops_dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Runs `promtool` with `args` in `docs/ops/`; fails saying how to install
/// it when it is missing.
fn promtool(args: &[&str]) -> Output {
    let program = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let output = Command::new(&program)
        .args(args)
        .current_dir(ops_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{program}` ({e}): promtool is missing; install it with \
                 scripts/dev-services (Debian's prometheus package), or set PROMTOOL"
            )
        });
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn the_alert_rules_are_valid() {
    let output = promtool(&["check", "rules", "alerts.yml"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("SUCCESS: 6 rules found"), "{stdout}");
}

#[test]
fn each_alert_fires_on_its_series_and_not_otherwise() {
    let output = promtool(&["test", "rules", "alerts.test.yml"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("SUCCESS"), "{stdout}");
    // Every alert of the rule file is tested.
    let tests = read("alerts.test.yml");
    for alert in alert_names(&read("alerts.yml")) {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "alerts.test.yml does not test {alert}"
        );
    }
}

/// The `alert:` names of a rule file.
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("- alert:"))
        .map(|name| name.trim().to_owned())
        .collect()
}

/// The PromQL expressions of a rule file: each `expr:` value, also a block
/// scalar (`expr: |` followed by more indented lines).
fn rule_expressions(rules: &str) -> Vec<String> {
    let lines: Vec<&str> = rules.lines().collect();
    let mut exprs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(value) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let indent = line.len() - line.trim_start().len();
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .copied()
                .collect();
            exprs.push(block.join("\n"));
        } else {
            exprs.push(value.to_owned());
        }
    }
    exprs
}

/// The PromQL expressions of a Grafana dashboard: every target's `expr`,
/// in panels and in rows' nested panels.
fn dashboard_expressions(dashboard: &Value) -> Vec<String> {
    let mut exprs = Vec::new();
    let mut stack = vec![dashboard];
    while let Some(node) = stack.pop() {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    exprs.push(expr.clone());
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    exprs
}

/// The metric names in a PromQL expression: identifiers starting with
/// `outbox_`, outside string literals (label values).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = expr.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if matches!(c, '"' | '\'' | '`') {
            // Skip the literal, escapes included.
            let mut escaped = false;
            for (_, d) in chars.by_ref() {
                if escaped {
                    escaped = false;
                } else if d == '\\' {
                    escaped = true;
                } else if d == c {
                    break;
                }
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let mut end = start + c.len_utf8();
            while let Some(&(i, d)) = chars.peek() {
                if !(d.is_ascii_alphanumeric() || d == '_' || d == ':') {
                    break;
                }
                end = i + d.len_utf8();
                chars.next();
            }
            let ident = &expr[start..end];
            if ident.starts_with("outbox_") {
                names.insert(ident.to_owned());
            }
        } else if c.is_ascii_digit() {
            // A number or duration (`5m`): not an identifier.
            while chars
                .peek()
                .is_some_and(|&(_, d)| d.is_ascii_alphanumeric() || d == '.' || d == '_')
            {
                chars.next();
            }
        }
    }
    names
}

#[test]
fn the_tokenizer_finds_metric_names_and_skips_labels_and_literals() {
    let names = metric_names(
        r#"sum by (consumer) (rate(outbox_consumer_processed_total{consumer="outbox_x"}[5m])) / max(outbox_dead) > 0 or absent(outbox_relays_live)"#,
    );
    let expected: BTreeSet<String> = [
        "outbox_consumer_processed_total",
        "outbox_dead",
        "outbox_relays_live",
    ]
    .map(String::from)
    .into();
    assert_eq!(names, expected);
    assert_eq!(
        rule_expressions(
            "  - alert: A\n    expr: max(outbox_dead) > 0\n  - alert: B\n    expr: |\n      max(outbox_backlog)\n        > 1\n    for: 1m\n"
        ),
        [
            "max(outbox_dead) > 0",
            "      max(outbox_backlog)\n        > 1"
        ]
    );
}

/// Every metric name the rules and the dashboard use.
fn used_metrics() -> BTreeSet<String> {
    let rules = read("alerts.yml");
    let dashboard: Value = serde_json::from_str(&read("dashboard.json"))
        .unwrap_or_else(|e| panic!("docs/ops/dashboard.json is not JSON: {e}"));
    let mut exprs = rule_expressions(&rules);
    assert_eq!(
        exprs.len(),
        alert_names(&rules).len(),
        "one expression per alert"
    );
    let panels = dashboard_expressions(&dashboard);
    assert!(!panels.is_empty(), "the dashboard has queries");
    exprs.extend(panels);
    let names: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    assert!(
        names.contains("outbox_dead") && names.contains("outbox_consumer_dead_letters"),
        "{names:?}"
    );
    names
}

/// The metric names on a `/metrics` page (sample lines; a summary's or
/// histogram's `_sum`, `_count` and `_bucket` series under their own names).
fn exported_metrics(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The example's `all` role in a process of its own, with its own database,
/// exchange and queues; all of them removed on drop.
struct Shop {
    name: String,
    port: u16,
    log: PathBuf,
    child: Child,
    /// Deletes the exchanges and queues (also when the test panics).
    _broker: BrokerCleanup,
    /// Drops the database (also when the test panics).
    _database: TestDatabase,
}

impl Shop {
    fn start() -> Shop {
        let name = names::unique("ecommerce_ops", "metrics");
        let database = TestDatabase::reserve(&database_url(), &name);
        let broker = BrokerCleanup::new(&amqp_url(), &name);
        broker.exchange(format!("{name}.events"));
        for queue in ["inventory", "loyalty", "orders"] {
            broker.queue(format!("{name}.{queue}"));
            broker.queue(format!("{name}.{queue}.dead"));
            broker.exchange(format!("{name}.{queue}.dlx"));
        }
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.log"));
        let port = free_port();
        let output = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .arg("all")
            .env("DATABASE_URL", database.url())
            .env("AMQP_URL", amqp_url())
            .env("BIND", format!("127.0.0.1:{port}"))
            .env("EXCHANGE", format!("{name}.events"))
            .env("QUEUE_PREFIX", &name)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary().display()));
        Shop {
            name,
            port,
            log,
            child,
            _broker: broker,
            _database: database,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "--- last lines of {} ---\n{}",
                self.log.display(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exported_by_the_example() {
    let used = used_metrics();
    let shop = Shop::start();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let deadline = Instant::now() + STARTUP;
    while !http
        .get(shop.url("/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "no healthy /healthz within {STARTUP:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Traffic, so that the counters and histograms exist: an order placed
    // and paid (published, consumed), and one undecodable message in the
    // loyalty queue (dead-lettered).
    let response = http
        .put(shop.url("/inventory/mug"))
        .json(&json!({ "available": 2 }))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{response:?}");
    let response = http
        .post(shop.url("/orders"))
        .json(&json!({
            "customer_id": Uuid::now_v7(),
            "items": [{"sku": "mug", "quantity": 1, "unit_price_cents": 250}],
        }))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{response:?}");
    let order: Value = response.json().await.unwrap();
    let order = order["id"].as_str().unwrap();
    let response = http
        .post(shop.url(&format!("/orders/{order}/pay")))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{response:?}");
    let amqp = outbox_testkit::amqp::connect(&amqp_url(), &format!("{}.test", shop.name)).await;
    let channel = amqp.create_channel().await.unwrap();
    channel
        .basic_publish(
            "".into(),
            format!("{}.loyalty", shop.name).as_str().into(),
            BasicPublishOptions::default(),
            b"not json {",
            BasicProperties::default(),
        )
        .await
        .unwrap();

    let mut missing;
    let mut page;
    let deadline = Instant::now() + STARTUP;
    loop {
        page = http
            .get(shop.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let exported = exported_metrics(&page);
        missing = used.difference(&exported).cloned().collect::<Vec<_>>();
        if missing.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = amqp.close(200, "OK".into()).await;
    assert!(
        missing.is_empty(),
        "metrics used by docs/ops/alerts.yml or docs/ops/dashboard.json but not exported by the \
         example's /metrics within {STARTUP:?}: {missing:?}\n--- /metrics ---\n{page}"
    );
}
