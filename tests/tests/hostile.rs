//! Bad and hostile input end to end, through the `outbox` facade: payloads
//! at the edges (empty, about 1 MiB, deeply nested, non-ASCII, `\u0000`
//! escapes, non-canonical JSON text) and aggregate ids full of quotes, SQL
//! meta-characters and 1,000 characters, each recorded in a real PostgreSQL
//! transaction, relayed to a real RabbitMQ queue and compared byte for byte
//! with what was recorded: the stored row, the message body, the
//! `aggregate_id` and `cloudEvents:subject` headers, and what a consumer
//! decodes. What the outbox cannot take is refused at record time with a
//! typed error, and nothing of the transaction is stored. The limits found
//! here are documented in the `outbox-diesel` crate docs ("Limits").
//!
//! Each test owns a PostgreSQL schema and an exchange/queue pair named after
//! the test, the process and a counter; all are removed when the test ends,
//! also when it fails. Needs PostgreSQL and RabbitMQ at `DATABASE_URL` /
//! `AMQP_URL` (defaults: the local servers of `scripts/dev-services`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use outbox_testkit::eventually::eventually;
use outbox_testkit::urls::database_url;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{Integer, Text};
use diesel_async::{AsyncConnection as _, RunQueryDsl};
use lapin::message::Delivery;
use lapin::options::BasicGetOptions;
use outbox::postgres::Error;
use outbox::rabbitmq::wire;
use outbox::{DeadSelector, DomainEvent, EventEnvelope, OutboxStore as _, RetryPolicy};
use outbox_tests::Pipeline;
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

/// How long an eventual effect (delivery, a mark) may take.
const WAIT: Duration = Duration::from_secs(60);

/// An event whose payload is any JSON value and whose aggregate id is any
/// string: what a careless or hostile caller can hand the outbox.
#[derive(Serialize)]
#[serde(transparent)]
struct Edge {
    #[serde(skip)]
    aggregate_id: String,
    payload: Value,
}

impl Edge {
    fn new(aggregate_id: impl Into<String>, payload: Value) -> Edge {
        Edge {
            aggregate_id: aggregate_id.into(),
            payload,
        }
    }
}

impl DomainEvent for Edge {
    fn aggregate_type(&self) -> &'static str {
        "order"
    }
    fn event_type(&self) -> &'static str {
        "order.edge"
    }
    fn aggregate_id(&self) -> String {
        self.aggregate_id.clone()
    }
}

/// The envelope of an event of aggregate `aggregate_id` whose payload is
/// exactly `payload` (any text: `record_envelopes` stores what it is given).
fn raw(aggregate_id: &str, payload: String) -> EventEnvelope {
    let mut envelope = EventEnvelope::from_event(&Edge::new(aggregate_id, json!({}))).unwrap();
    envelope.payload = payload;
    envelope
}

/// `depth` nested arrays around nothing: `[[…[]…]]`.
fn nested_arrays(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// `depth` nested objects around `0`: `{"a":{"a":…0…}}`.
fn nested_objects(depth: usize) -> String {
    format!("{}0{}", "{\"a\":".repeat(depth), "}".repeat(depth))
}

/// `depth` nested objects as a `serde_json::Value` (kept well below
/// serde_json's recursion limit of 128 for parsing, which does not apply
/// to building and serializing).
fn nested_value(depth: usize) -> Value {
    (0..depth).fold(
        json!("bottom"),
        |inner, level| json!({ format!("level {level}"): inner }),
    )
}

/// A deterministic stream of pseudo-random numbers (xorshift64*), so the
/// "random" ids and payloads are the same in every run.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `n` characters drawn from `alphabet`.
    fn string(&mut self, alphabet: &[char], n: usize) -> String {
        (0..n)
            .map(|_| alphabet[(self.next() % alphabet.len() as u64) as usize])
            .collect()
    }
}

/// A row as PostgreSQL returns it, the payload as text.
#[derive(QueryableByName, Debug)]
struct Stored {
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Text)]
    aggregate_id: String,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
}

/// A migrated schema with a `business` table (the caller's own change in
/// the recording transaction), an exchange, and a queue bound to it with
/// `order.#`, relays with batches of 50; all removed on drop (also when
/// the test panics).
async fn env(test: &str) -> Pipeline {
    let pipeline = Pipeline::new("hostile", test, "order.#")
        .await
        .batch_size(50);
    pipeline
        .run_sql("CREATE TABLE {schema}.business (note text NOT NULL)")
        .await;
    pipeline
}

/// In one transaction: a row in `business`, then `envelopes` recorded;
/// committed if recording succeeds, rolled back otherwise. Returns the
/// recording's error.
async fn record(env: &Pipeline, envelopes: &[EventEnvelope]) -> Result<(), Error> {
    let mut conn = outbox::postgres::connect(&database_url()).await.unwrap();
    conn.transaction::<_, Error, _>(async |conn| {
        diesel::sql_query(format!(
            "INSERT INTO \"{}\".business (note) VALUES ('changed')",
            env.schema
        ))
        .execute(conn)
        .await?;
        env.outbox.record_envelopes(conn, envelopes).await
    })
    .await
}

/// Records `events` with `Outbox::record`, one by one, in one
/// committed transaction; returns their ids.
async fn record_events(env: &Pipeline, events: &[Edge]) -> Vec<Uuid> {
    let mut conn = outbox::postgres::connect(&database_url()).await.unwrap();
    conn.transaction::<_, Error, _>(async |conn| {
        let mut ids = Vec::new();
        for event in events {
            ids.push(env.outbox.record(conn, event).await?);
        }
        Ok(ids)
    })
    .await
    .unwrap()
}

/// Outbox rows and business rows: what a transaction left behind.
async fn footprint(env: &Pipeline) -> (i64, i64) {
    (
        env.count("SELECT count(*) AS n FROM {schema}.outbox_events")
            .await,
        env.count("SELECT count(*) AS n FROM {schema}.business")
            .await,
    )
}

async fn stored(env: &Pipeline, id: Uuid) -> Stored {
    let mut conn = env.pool.get().await.unwrap();
    diesel::sql_query(format!(
        "SELECT payload::text AS payload, aggregate_id, status, attempts \
         FROM \"{}\".outbox_events WHERE id = $1",
        env.schema
    ))
    .bind::<diesel::sql_types::Uuid, _>(id)
    .get_result(&mut *conn)
    .await
    .unwrap()
}

/// Takes messages from the queue until one arrived for each of `ids`;
/// returns them by message id.
async fn receive(env: &Pipeline, ids: &[Uuid]) -> HashMap<Uuid, Delivery> {
    let mut received = HashMap::new();
    let deadline = Instant::now() + WAIT;
    while ids.iter().any(|id| !received.contains_key(id)) {
        let got = env
            .channel
            .basic_get(env.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        match got {
            Some(message) => {
                let delivery = message.delivery;
                let id: Uuid = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .expect("every message has a message_id")
                    .as_str()
                    .parse()
                    .unwrap();
                assert!(
                    received.insert(id, delivery).is_none(),
                    "event {id} delivered twice without a fault"
                );
            }
            None => {
                let missing = ids.iter().filter(|id| !received.contains_key(*id)).count();
                assert!(
                    Instant::now() < deadline,
                    "{missing} of {} events not delivered within {WAIT:?}",
                    ids.len()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    received
}

/// Messages ready in the queue.
async fn count_ready(env: &Pipeline) -> u32 {
    env.broker.ready(&env.queue).await
}

/// Waits until `sql` (a count) is `n`.
async fn wait_count(env: &Pipeline, what: &str, sql: &str, n: i64) {
    eventually(what)
        .within(WAIT)
        .equals(n, || env.count(sql))
        .await;
}

/// Relays everything recorded and returns the deliveries of `ids`, once
/// every row is marked sent.
async fn relay(env: &Pipeline, ids: &[Uuid]) -> HashMap<Uuid, Delivery> {
    let (handle, task) = env.start(env.publisher().build().unwrap(), RetryPolicy::default());
    let received = receive(env, ids).await;
    let total = env
        .count("SELECT count(*) AS n FROM {schema}.outbox_events")
        .await;
    wait_count(
        env,
        "rows marked sent",
        "SELECT count(*) AS n FROM {schema}.outbox_events WHERE status = 'sent'",
        total,
    )
    .await;
    handle.shutdown();
    task.await.unwrap();
    received
}

/// Asserts that event `id`, recorded with `aggregate_id` and `payload`,
/// is stored as it was recorded and arrived as it was stored.
async fn assert_exact(
    env: &Pipeline,
    what: &str,
    id: Uuid,
    aggregate_id: &str,
    payload: &str,
    delivery: &Delivery,
) {
    let stored = stored(env, id).await;
    assert!(stored.payload == payload, "{what}: stored payload differs");
    assert!(
        stored.aggregate_id == aggregate_id,
        "{what}: stored aggregate id differs"
    );
    assert_eq!(stored.status, "sent", "{what}");
    assert!(
        delivery.data == payload.as_bytes(),
        "{what}: the message body differs from the recorded payload ({} vs {} bytes)",
        delivery.data.len(),
        payload.len()
    );
    let headers = delivery.properties.headers().as_ref().unwrap();
    assert_eq!(
        wire::header_str(headers, wire::AGGREGATE_ID),
        Some(aggregate_id),
        "{what}: aggregate_id header"
    );
    assert_eq!(
        wire::header_str(headers, wire::CE_SUBJECT),
        Some(aggregate_id),
        "{what}: cloudEvents:subject header"
    );
    assert_eq!(
        delivery
            .properties
            .content_type()
            .as_ref()
            .unwrap()
            .as_str(),
        wire::CONTENT_TYPE,
        "{what}"
    );
    // What an `InboxConsumer` hands its handler.
    let incoming = wire::decode(
        &delivery.properties,
        delivery.routing_key.as_str(),
        &delivery.data,
    )
    .unwrap_or_else(|e| panic!("{what}: a consumer cannot decode it: {e}"));
    assert_eq!(incoming.id, id, "{what}");
    assert!(
        incoming.payload == payload,
        "{what}: decoded payload differs"
    );
    assert_eq!(incoming.aggregate_id, aggregate_id, "{what}");
}

/// Payloads of typed events (`Outbox::record`): what serde_json makes of
/// them is stored, relayed and decoded unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_payloads_of_typed_events_are_stored_and_delivered_byte_exact() {
    let env = env("typed").await;

    // A little over 1 MiB: 8,192 members, each 72 characters of mixed
    // scripts, emoji and characters JSON escapes.
    let mut noise = Noise(0x9E37_79B9_7F4A_7C15);
    let alphabet: Vec<char> = "abcXYZ019 éßЖж漢字🦀\"\\/\n\t".chars().collect();
    let big: serde_json::Map<String, Value> = (0..8192)
        .map(|i| (format!("k{i:05}"), json!(noise.string(&alphabet, 72))))
        .collect();
    let big = Value::Object(big);
    let size = serde_json::to_string(&big).unwrap().len();
    assert!(
        (1 << 20..5 << 18).contains(&size),
        "between 1 and 1.25 MiB: {size} bytes"
    );

    let cases: Vec<(&str, Value)> = vec![
        ("an empty object", json!({})),
        ("an empty array", json!([])),
        ("null", Value::Null),
        ("about 1 MiB", big),
        ("100 nested objects", nested_value(100)),
        (
            "non-ASCII keys and values",
            json!({
                "emoji 🦀": "🦀🎉👩‍👩‍👧‍👦 (a ZWJ sequence)",
                "עברית": "שלום עולם",
                "العربية": "مرحبا بالعالم",
                "rtl override \u{202e}": "abc\u{202e}def\u{202c}",
                "combining": "e\u{301} vs \u{e9}",
                "cjk 漢字": "かなカナ한국어",
                "bom \u{feff}": "\u{feff}",
                "line separators": "\u{2028}\u{2029}",
                "controls": "\u{1}\u{1f}\u{7f}\u{9f}",
                "escapes": "\"quoted\" \\ back\\slash / \n\r\t",
                "</script>": "<!-- ]]> --",
            }),
        ),
        (
            "NUL characters, as \\u0000 escapes",
            json!({ "nul\u{0}key": "a\u{0}b", "\u{0}": ["\u{0}\u{0}"] }),
        ),
    ];
    let nul = serde_json::to_string(&cases[6].1).unwrap();
    assert!(nul.contains(r"a\u0000b"), "serde_json escapes NUL: {nul}");
    let events: Vec<Edge> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, payload))| Edge::new(format!("typed-{i}"), payload.clone()))
        .collect();
    let ids = record_events(&env, &events).await;
    let deliveries = relay(&env, &ids).await;

    for (((what, payload), event), id) in cases.iter().zip(&events).zip(&ids) {
        let text = serde_json::to_string(payload).unwrap();
        assert_exact(&env, what, *id, &event.aggregate_id, &text, &deliveries[id]).await;
    }
}

/// Payload text given as is (`Outbox::record_envelopes`): the `json` column
/// keeps it byte-exact where `jsonb` (or a round trip through
/// `serde_json::Value`) would not: whitespace, key order, duplicate keys,
/// number spelling, escapes, `\u0000`, lone surrogates, 10,000 levels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_payload_text_is_stored_and_delivered_byte_exact() {
    let env = env("text").await;
    // The column is `json`, which keeps the text; `jsonb` would reject
    // `\u0000` and normalize the rest.
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) AS n FROM information_schema.columns WHERE table_schema = '{}' \
             AND table_name = 'outbox_events' AND column_name = 'payload' AND data_type = 'json'",
            env.schema
        ))
        .await,
        1,
        "outbox_events.payload is `json`"
    );

    let cases: Vec<(&str, String)> = vec![
        ("{}", "{}".into()),
        (
            "whitespace, key order, duplicate keys",
            " \n{ \"b\" : 1,\t\"a\":1, \"a\" : 2 }\r\n ".into(),
        ),
        (
            "number spellings",
            "[1.0e2, -0.0, 1E-400, 123456789012345678901234567890.5]".into(),
        ),
        (
            "escaped and literal non-ASCII",
            r#"{"\u00e9":"é","\ud83e\udd80":"🦀","\/":"/"}"#.into(),
        ),
        (
            "a \\u0000 escape",
            r#"{"nul":"a\u0000b","\u0000":0}"#.into(),
        ),
        ("a lone surrogate escape", r#"["\ud800","\udfff"]"#.into()),
        ("a bare string", r#""just a string""#.into()),
        ("10,000 nested arrays", nested_arrays(10_000)),
        ("10,000 nested objects", nested_objects(10_000)),
    ];
    let envelopes: Vec<EventEnvelope> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, payload))| raw(&format!("text-{i}"), payload.clone()))
        .collect();
    record(&env, &envelopes).await.unwrap();
    let ids: Vec<Uuid> = envelopes.iter().map(|e| e.id).collect();
    let deliveries = relay(&env, &ids).await;

    for ((what, payload), envelope) in cases.iter().zip(&envelopes) {
        assert_exact(
            &env,
            what,
            envelope.id,
            &envelope.aggregate_id,
            payload,
            &deliveries[&envelope.id],
        )
        .await;
    }
    assert_eq!(footprint(&env).await, (9, 1));
}

/// What PostgreSQL's `json` input cannot parse fails the `INSERT`: the
/// caller gets `Error::Database` from `record_envelopes` and its
/// transaction rolls back, business change included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_postgresql_cannot_parse_are_rejected_at_record_time_and_nothing_is_stored() {
    let env = env("unparsable").await;
    let cases: Vec<(&str, String, &str)> = vec![
        // 1,000,000 levels exceed any `max_stack_depth` a platform allows
        // (the default 2 MB stops near 13,000 objects / 14,500 arrays).
        (
            "1,000,000 nested arrays",
            nested_arrays(1_000_000),
            "stack depth limit exceeded",
        ),
        (
            "truncated JSON",
            r#"{"a":"#.into(),
            "invalid input syntax for type json",
        ),
        (
            "trailing garbage",
            "{} {}".into(),
            "invalid input syntax for type json",
        ),
        (
            "empty text",
            String::new(),
            "invalid input syntax for type json",
        ),
        (
            "a bad escape",
            r#"["\x"]"#.into(),
            "invalid input syntax for type json",
        ),
    ];
    for (what, payload, reason) in cases {
        // Alone (one event) and behind a valid one (several events).
        let bad = raw("bad", payload);
        for envelopes in [vec![bad.clone()], vec![raw("fine", "{}".into()), bad]] {
            let n = envelopes.len();
            let err = record(&env, &envelopes)
                .await
                .expect_err(&format!("{what} is refused"));
            assert!(
                matches!(err, Error::Database(_)),
                "{what} ({n} events): a database error, got {err:?}"
            );
            assert!(err.to_string().contains(reason), "{what}: {err}");
            assert_eq!(
                footprint(&env).await,
                (0, 0),
                "{what} ({n} events): nothing of the transaction is stored"
            );
        }
    }
    // The connection pool and the schema are fine afterwards.
    record(&env, &[raw("fine", "{}".into())]).await.unwrap();
    assert_eq!(footprint(&env).await, (1, 1));
}

/// Aggregate ids that would break string-built SQL, headers or logs are
/// stored, relayed and decoded unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_aggregate_ids_are_stored_and_delivered_byte_exact() {
    let env = env("ids").await;
    env.run_sql(&format!("CREATE TABLE \"{}\".x (n int)", env.schema))
        .await;
    let mut noise = Noise(0xD1B5_4A32_D192_ED03);
    let alnum: Vec<char> = ('a'..='z').chain('A'..='Z').chain('0'..='9').collect();
    let drop_x = format!("'; DROP TABLE \"{}\".x; --", env.schema);
    let ids: Vec<String> = vec![
        "it's".into(),
        "\"double\" 'single' `back`".into(),
        r"back\slash\\ \x00 \n".into(),
        drop_x,
        "\"); DROP TABLE x; --".into(),
        "%".into(),
        "_".into(),
        "o_1%".into(),
        "$1 ? :name @p".into(),
        "line\nbreak\r\nand\ttab".into(),
        "{\"json\": [\"id\"]}".into(),
        " leading and trailing spaces ".into(),
        "🦀 שלום مرحبا \u{202e}evil".into(),
        "x".repeat(1000),
        noise.string(&alnum, 1000),
        // Mixed widths close to the 2,048-byte limit.
        "é🦀ש\u{301}".repeat(204),
    ];
    let events: Vec<Edge> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Edge::new(id.clone(), json!({ "n": i })))
        .collect();
    let recorded = record_events(&env, &events).await;
    let deliveries = relay(&env, &recorded).await;

    for ((aggregate_id, event), id) in ids.iter().zip(&events).zip(&recorded) {
        let payload = serde_json::to_string(event).unwrap();
        assert_exact(
            &env,
            &format!("aggregate id {aggregate_id:?}"),
            *id,
            aggregate_id,
            &payload,
            &deliveries[id],
        )
        .await;
    }
    assert_eq!(
        ids.iter().map(|id| id.chars().count()).max(),
        Some(1000),
        "1,000-character ids are among them"
    );
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) AS n FROM pg_tables WHERE schemaname = '{}' AND tablename = 'x'",
            env.schema
        ))
        .await,
        1,
        "nothing was executed from an id"
    );
}

/// An empty aggregate id (or type, or event type) has no aggregate to order
/// by, and PostgreSQL text cannot hold NUL: both are refused by
/// `EventEnvelope::validate` with `Error::Event(InvalidEvent)` before any
/// SQL runs, the transaction stays usable, and after a rollback nothing
/// is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_nul_ids_are_rejected_at_record_time_and_nothing_is_stored() {
    let env = env("invalid").await;

    // Typed events: `Outbox::record` refuses them.
    for (aggregate_id, reason) in [
        ("", "aggregate_id is empty"),
        ("a\0b", "aggregate_id contains a NUL character"),
    ] {
        let mut conn = outbox::postgres::connect(&database_url()).await.unwrap();
        let err = conn
            .transaction::<(), Error, _>(async |conn| {
                diesel::sql_query(format!(
                    "INSERT INTO \"{}\".business (note) VALUES ('changed')",
                    env.schema
                ))
                .execute(conn)
                .await?;
                let err = env
                    .outbox
                    .record(conn, &Edge::new(aggregate_id, json!({})))
                    .await
                    .expect_err("refused");
                // Nothing ran: the transaction still takes statements.
                diesel::sql_query("SELECT 1").execute(conn).await?;
                Err(err)
            })
            .await
            .unwrap_err();
        match &err {
            Error::Event(outbox::Error::InvalidEvent {
                event_type,
                reason: got,
            }) => {
                assert_eq!(event_type, "order.edge");
                assert_eq!(got, reason, "{aggregate_id:?}");
            }
            other => panic!("{aggregate_id:?}: expected InvalidEvent, got {other:?}"),
        }
        assert_eq!(footprint(&env).await, (0, 0), "{aggregate_id:?}");
    }

    // Envelopes built by hand bypass `from_event`: `record_envelopes`
    // validates them again; one bad envelope refuses the whole call.
    let good = raw("fine", "{}".into());
    let mut empty_id = raw("x", "{}".into());
    empty_id.aggregate_id = String::new();
    let mut nul_type = raw("x", "{}".into());
    nul_type.event_type = "order.\0".into();
    let nul_header = raw("x", "{}".into()).with_correlation_id("c\0");
    let empty_header = raw("x", "{}".into()).with_header("", "v");
    for (what, bad) in [
        ("an empty aggregate id", empty_id),
        ("a NUL in the event type", nul_type),
        ("a NUL in a header value", nul_header),
        ("an empty header name", empty_header),
    ] {
        let err = record(&env, &[good.clone(), bad])
            .await
            .expect_err(&format!("{what} is refused"));
        assert!(
            matches!(err, Error::Event(outbox::Error::InvalidEvent { .. })),
            "{what}: {err:?}"
        );
        assert_eq!(footprint(&env).await, (0, 0), "{what}");
    }
}

/// `%` and `_` are not wildcards anywhere an aggregate id is matched: a
/// dead event holds back its own aggregate only, and replaying the dead
/// events of aggregate `%` replays exactly those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_characters_in_aggregate_ids_match_only_themselves() {
    let env = env("wildcards").await;
    let aggregates = ["%", "_", "o_1", "o%"];
    let first = record_events(
        &env,
        &aggregates
            .iter()
            .map(|a| Edge::new(*a, json!({ "first": a })))
            .collect::<Vec<_>>(),
    )
    .await;

    // Unroutable (the queue binds `order.#`), spending attempts: one, then
    // dead.
    let publisher = env
        .publisher()
        .routing_key(|_| "nowhere".into())
        .build()
        .unwrap();
    let (handle, task) = env.start_with(
        publisher,
        RetryPolicy::default().max_attempts(1),
        outbox::UnroutablePolicy::SpendAttempts,
    );
    wait_count(
        &env,
        "every first event dead",
        "SELECT count(*) AS n FROM {schema}.outbox_events WHERE status = 'dead'",
        4,
    )
    .await;
    handle.shutdown();
    task.await.unwrap();

    // Aggregates whose ids the dead ones would match as LIKE patterns, and
    // a second event of `%`, which its dead first event holds back.
    let second = record_events(
        &env,
        &[
            Edge::new("zzz", json!({})),
            Edge::new("o11", json!({})),
            Edge::new("o%x", json!({})),
            Edge::new("%", json!({ "second": "%" })),
        ],
    )
    .await;
    let (handle, task) = env.start(env.publisher().build().unwrap(), RetryPolicy::default());
    let delivered = receive(&env, &second[..3]).await;
    wait_count(
        &env,
        "the three unblocked events sent",
        "SELECT count(*) AS n FROM {schema}.outbox_events WHERE status = 'sent'",
        3,
    )
    .await;
    assert_eq!(delivered.len(), 3);
    let held = stored(&env, second[3]).await;
    assert_eq!(
        (held.status.as_str(), held.attempts),
        ("held", 0),
        "`%` is held back by its own dead event"
    );

    // Replaying aggregate `%` replays its dead event only; it and the held
    // event are then delivered, in order.
    let replayed = env
        .store()
        .replay_dead(DeadSelector::Aggregate {
            aggregate_type: "order".into(),
            aggregate_id: "%".into(),
        })
        .await
        .unwrap();
    assert_eq!(replayed, 1, "only the dead event of aggregate `%`");
    let replayed_underscore = env
        .store()
        .replay_dead(DeadSelector::Aggregate {
            aggregate_type: "order".into(),
            aggregate_id: "o_".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        replayed_underscore, 0,
        "`o_` matches neither `o_1` nor `o%`"
    );
    let mut order = Vec::new();
    let deadline = Instant::now() + WAIT;
    while order.len() < 2 {
        let got = env
            .channel
            .basic_get(env.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        match got {
            Some(message) => order.push(
                message
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .unwrap()
                    .as_str()
                    .parse::<Uuid>()
                    .unwrap(),
            ),
            None => {
                assert!(Instant::now() < deadline, "aggregate `%` not delivered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    handle.shutdown();
    task.await.unwrap();
    assert_eq!(order, [first[0], second[3]], "aggregate `%` in order");
    for (aggregate, id) in aggregates.iter().zip(&first).skip(1) {
        assert_eq!(
            stored(&env, *id).await.status,
            "dead",
            "{aggregate} stays dead"
        );
    }
}

/// The longest aggregate id the library takes
/// (`EventEnvelope::MAX_AGGREGATE_ID_BYTES`, 2,048 bytes), incompressible,
/// still fits the index of held-back events (`outbox_events_blocking`,
/// entries limited to 2,704 bytes by PostgreSQL): when its publish fails it
/// spends its attempts and ends dead like any other event, and its batch
/// neighbour is delivered once. One byte more is refused at record time
/// with a typed error, before any SQL runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_aggregate_id_ends_dead_when_unroutable_and_a_longer_one_is_refused() {
    let env = env("long_id").await;
    let max = outbox::EventEnvelope::MAX_AGGREGATE_ID_BYTES;
    let mut noise = Noise(0x2545_F491_4F6C_DD1D);
    let cjk: Vec<char> = ('\u{4E00}'..='\u{9FFF}').collect();
    // 682 three-byte characters and two ASCII ones: exactly the limit.
    let longest = format!("{}ab", noise.string(&cjk, (max - 2) / 3));
    assert_eq!(longest.len(), max);

    let mut over = raw("x", "{}".into());
    over.aggregate_id = format!("{longest}c");
    let err = record(&env, &[over])
        .await
        .expect_err("one byte over the limit is refused");
    match err {
        Error::Event(outbox::Error::InvalidEvent { reason, .. }) => {
            assert!(
                reason.contains("aggregate_id is 2049 bytes long"),
                "{reason}"
            );
        }
        other => panic!("expected InvalidEvent, got {other:?}"),
    }
    assert_eq!(footprint(&env).await, (0, 0));

    let poison = raw(&longest, "{}".into());
    let bystander = raw("bystander", "{}".into());
    record(&env, &[poison.clone(), bystander.clone()])
        .await
        .expect("the longest id is recorded");
    // The long id's event is unroutable; the bystander is not.
    let publisher = env
        .publisher()
        .routing_key(move |e| {
            if e.aggregate_id.len() > 1000 {
                "nowhere".into()
            } else {
                e.event_type.clone()
            }
        })
        .build()
        .unwrap();
    let retry = Pipeline::quick_retries(2);
    let (handle, task) = env.start_with(publisher, retry, outbox::UnroutablePolicy::SpendAttempts);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let poisoned = stored(&env, poison.id).await;
        if poisoned.status == "dead" {
            assert_eq!(poisoned.attempts, 2);
            break;
        }
        let delivered = count_ready(&env).await;
        assert!(
            Instant::now() < deadline,
            "after 30 s the long id's event is still {} with {} attempts, and the \
             bystander ({}) was delivered {delivered} times",
            poisoned.status,
            poisoned.attempts,
            stored(&env, bystander.id).await.status,
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.shutdown();
    task.await.unwrap();
    assert_eq!(stored(&env, bystander.id).await.status, "sent");
    assert_eq!(count_ready(&env).await, 1, "the bystander delivered once");
}

/// AMQP short strings hold at most 255 bytes, and the correlation id
/// becomes the `correlation_id` property: 255 bytes are recorded and
/// delivered, 256 are refused at record time with a typed error (so no
/// stored event can ever stop the relay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correlation_id_of_255_bytes_is_delivered_and_a_longer_one_is_refused() {
    let env = env("long_corr").await;
    let too_long = raw("o-1", "{}".into()).with_correlation_id("c".repeat(256));
    match record(&env, std::slice::from_ref(&too_long)).await {
        Err(Error::Event(outbox::Error::InvalidEvent { reason, .. })) => {
            assert!(
                reason.contains("correlation_id is 256 bytes long"),
                "{reason}"
            );
        }
        other => panic!("expected InvalidEvent, got {other:?}"),
    }
    assert_eq!(footprint(&env).await, (0, 0));

    let correlation = "c".repeat(255);
    let event = raw("o-1", "{}".into()).with_correlation_id(correlation.as_str());
    record(&env, std::slice::from_ref(&event)).await.unwrap();
    let (handle, task) = env.start(env.publisher().build().unwrap(), RetryPolicy::default());
    let deadline = Instant::now() + Duration::from_secs(30);
    while count_ready(&env).await == 0 {
        assert!(!task.is_finished(), "the relay stopped (panicked)");
        assert!(Instant::now() < deadline, "not delivered within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.shutdown();
    task.await.unwrap();
    let delivery = receive(&env, &[event.id]).await.remove(&event.id).unwrap();
    assert_eq!(
        delivery
            .properties
            .correlation_id()
            .as_ref()
            .map(|c| c.as_str()),
        Some(correlation.as_str())
    );
    let headers = delivery.properties.headers().as_ref().unwrap();
    assert_eq!(
        wire::header_str(headers, "correlation_id"),
        Some(correlation.as_str())
    );
}
