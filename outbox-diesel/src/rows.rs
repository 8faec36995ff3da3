//! What every back end makes of the rows its admin and dead-letter reads
//! return, in plain Rust: each back end decodes its own row types (their
//! SQL types differ: `timestamptz`, `DATETIME(6)`, …) into the plain
//! fields here, and the reports are built once, here.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use outbox_core::EventStatus;
use outbox_core::admin::{
    Attempt, AttemptOutcome, AuditEntry, AuditRecord, DeadLetter, DeadLetterRecord,
    EventTypeCounts, FailureGroup, Page, RelayInfo, StatusCounts, group_failures,
};
use uuid::Uuid;

/// `sent` and `skipped` rows counted exactly at most; beyond, the status
/// report estimates from the table's statistics.
pub(crate) const EXACT_COUNT_LIMIT: i64 = 100_000;

/// Rows a failure-group or dead-letter-group query reads at most
/// (distinct triples): the groups of a table with more are cut.
pub(crate) const GROUP_ROWS: i64 = 100_000;

/// A count read as `BIGINT`.
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A status column (the tables' CHECK allows only known ones).
pub(crate) fn status_name(s: &str) -> EventStatus {
    s.parse().unwrap_or(EventStatus::Pending)
}

/// A page of `items` read with `LIMIT limit`: a full page may have more
/// after its last item.
pub(crate) fn page_of<T>(items: Vec<T>, limit: usize, key: impl Fn(&T) -> i64) -> Page<T> {
    let next = if items.len() == limit {
        items.last().map(key)
    } else {
        None
    };
    Page::new(items, next)
}

/// The `sent` and `skipped` rows the status report counted (each at most
/// [`EXACT_COUNT_LIMIT`]), and the table's estimated size.
pub(crate) struct DoneCounts {
    pub(crate) sent: i64,
    pub(crate) skipped: i64,
    pub(crate) estimate: i64,
}

/// The status report's counts, in total and per event type (most unsent
/// and dead first), from rows (event type, status, count) of the unsent
/// and dead statuses and the [`DoneCounts`].
pub(crate) fn status_counts(
    by_type: impl IntoIterator<Item = (String, String, i64)>,
    done: &DoneCounts,
) -> (StatusCounts, Vec<EventTypeCounts>) {
    let mut counts = StatusCounts::default();
    let mut types: BTreeMap<String, StatusCounts> = BTreeMap::new();
    for (event_type, status, n) in by_type {
        let status = status_name(&status);
        counts.add(status, count(n));
        types.entry(event_type).or_default().add(status, count(n));
    }
    counts.skipped = count(done.skipped);
    counts.estimated = done.skipped >= EXACT_COUNT_LIMIT;
    if done.sent < EXACT_COUNT_LIMIT {
        counts.sent = count(done.sent);
    } else {
        counts.estimated = true;
        let others = counts.unsent() + counts.dead + counts.skipped;
        counts.sent = count(done.estimate)
            .saturating_sub(others)
            .max(count(done.sent));
    }
    let mut by_event_type: Vec<EventTypeCounts> = types
        .into_iter()
        .map(|(t, c)| EventTypeCounts::new(t, c))
        .collect();
    by_event_type.sort_by_key(|t| std::cmp::Reverse(t.counts.unsent() + t.counts.dead));
    (counts, by_event_type)
}

/// One row of the attempt history.
pub(crate) fn attempt(
    at: DateTime<Utc>,
    relay: Option<String>,
    outcome: &str,
    error: String,
) -> Attempt {
    Attempt::new(
        at,
        relay,
        AttemptOutcome::parse(outcome).unwrap_or(AttemptOutcome::Retry),
        error,
    )
}

/// A failure-group row: event type, error (normalized, or raw for rows
/// written before errors were normalized), status, count, first and last
/// occurrence.
pub(crate) struct GroupFields {
    pub(crate) event_type: String,
    pub(crate) error: String,
    pub(crate) status: String,
    pub(crate) n: i64,
    pub(crate) first: DateTime<Utc>,
    pub(crate) last: DateTime<Utc>,
}

/// The failure groups of `rows`; only group `only` when given.
pub(crate) fn failure_groups(
    rows: impl IntoIterator<Item = GroupFields>,
    only: Option<&str>,
) -> Vec<FailureGroup> {
    let mut groups = group_failures(rows.into_iter().map(|r| {
        (
            r.event_type,
            r.error,
            status_name(&r.status),
            count(r.n),
            r.first,
            r.last,
        )
    }));
    if let Some(group) = only {
        groups.retain(|g| g.id == group);
    }
    groups
}

/// The (event type, raw error) pairs of the rows (event type, error) that
/// make up failure group `group`.
pub(crate) fn group_members(
    rows: impl IntoIterator<Item = (String, String)>,
    group: &str,
) -> (Vec<String>, Vec<String>) {
    rows.into_iter()
        .filter(|(event_type, error)| {
            outbox_core::admin::group_id(event_type, &outbox_core::admin::normalize_error(error))
                == group
        })
        .unzip()
}

/// An `outbox_relays` row.
pub(crate) struct RelayFields {
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) version: String,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) heartbeat_at: DateTime<Utc>,
    pub(crate) in_flight: i32,
    pub(crate) paused: bool,
    pub(crate) live: bool,
}

impl From<RelayFields> for RelayInfo {
    fn from(r: RelayFields) -> Self {
        let mut info = RelayInfo::new(
            r.name,
            r.host,
            u32::try_from(r.pid).unwrap_or(0),
            r.version,
            r.started_at,
        );
        info.heartbeat_at = r.heartbeat_at;
        info.in_flight = u32::try_from(r.in_flight).unwrap_or(0);
        info.paused = r.paused;
        info.live = r.live;
        info
    }
}

/// An `outbox_audit` row (`target` as JSON text).
pub(crate) struct AuditFields {
    pub(crate) id: i64,
    pub(crate) at: DateTime<Utc>,
    pub(crate) identity: String,
    pub(crate) action: String,
    pub(crate) target: String,
    pub(crate) count: i64,
    pub(crate) finished_at: Option<DateTime<Utc>>,
    pub(crate) outcome: Option<String>,
}

impl From<AuditFields> for AuditRecord {
    fn from(r: AuditFields) -> Self {
        let target = serde_json::from_str(&r.target).unwrap_or(serde_json::Value::Null);
        let record = AuditRecord::new(
            r.id,
            r.at,
            AuditEntry::new(r.identity, r.action, target),
            count(r.count),
        );
        match (r.finished_at, r.outcome) {
            (Some(at), Some(outcome)) => record.finished(at, outcome),
            _ => record,
        }
    }
}

/// An `inbox_dead_letters` row.
pub(crate) struct LetterFields {
    pub(crate) id: i64,
    pub(crate) consumer: String,
    pub(crate) queue: String,
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) event_id: Option<Uuid>,
    pub(crate) message_id: Option<String>,
    pub(crate) event_type: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) reason: String,
    pub(crate) headers: serde_json::Value,
    pub(crate) payload: String,
    pub(crate) payload_truncated: bool,
    pub(crate) dead_lettered_at: DateTime<Utc>,
    pub(crate) replayed_at: Option<DateTime<Utc>>,
    pub(crate) purged_at: Option<DateTime<Utc>>,
}

impl From<LetterFields> for DeadLetterRecord {
    fn from(row: LetterFields) -> Self {
        let mut letter = DeadLetter::new(
            row.consumer,
            row.queue,
            row.exchange,
            row.routing_key,
            row.reason,
            b"",
        );
        letter.event_id = row.event_id;
        letter.message_id = row.message_id;
        letter.event_type = row.event_type;
        letter.attempts = u32::try_from(row.attempts).unwrap_or(0);
        letter.dead_lettered_at = row.dead_lettered_at;
        letter.headers = match row.headers {
            serde_json::Value::Object(map) => map
                .into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => (k, s),
                    other => (k, other.to_string()),
                })
                .collect(),
            _ => BTreeMap::new(),
        };
        letter.payload = row.payload;
        letter.payload_truncated = row.payload_truncated;
        DeadLetterRecord::new(row.id, letter, row.replayed_at, row.purged_at)
    }
}

/// A page of dead-letter records from `rows`, read with `LIMIT limit + 1`
/// (a row past `limit` says there are more); redacted unless `payloads`.
pub(crate) fn letter_page(
    rows: impl IntoIterator<Item = LetterFields>,
    limit: usize,
    payloads: bool,
) -> Page<DeadLetterRecord> {
    let mut items: Vec<DeadLetterRecord> = rows
        .into_iter()
        .take(limit + 1)
        .map(|row| {
            let record = DeadLetterRecord::from(row);
            if payloads { record } else { record.redacted() }
        })
        .collect();
    let more = items.len() > limit;
    items.truncate(limit);
    let next = if more {
        items.last().map(|r| r.id)
    } else {
        None
    };
    Page::new(items, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(id: i64, headers: serde_json::Value) -> LetterFields {
        LetterFields {
            id,
            consumer: "c".into(),
            queue: "q".into(),
            exchange: "q.dlx".into(),
            routing_key: "k".into(),
            event_id: None,
            message_id: None,
            event_type: None,
            attempts: 2,
            reason: "r".into(),
            headers,
            payload: "{}".into(),
            payload_truncated: false,
            dead_lettered_at: Utc::now(),
            replayed_at: None,
            purged_at: None,
        }
    }

    #[test]
    fn a_letter_page_read_with_one_more_row_says_where_the_next_starts() {
        let rows = (1..=3).map(|id| letter(id, serde_json::json!({"a": "b", "n": 1})));
        let page = letter_page(rows, 2, true);
        assert_eq!(page.items.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(page.next, Some(2));
        assert_eq!(page.items[0].letter.headers["a"], "b");
        assert_eq!(
            page.items[0].letter.headers["n"], "1",
            "non-strings as JSON"
        );
        let last = letter_page([letter(3, serde_json::Value::Null)], 2, false);
        assert_eq!(last.next, None);
        assert!(last.items[0].redacted && last.items[0].letter.payload.is_empty());
    }

    #[test]
    fn status_counts_estimate_sent_rows_past_the_exact_limit() {
        let rows = [
            ("a".to_owned(), "pending".to_owned(), 2),
            ("b".to_owned(), "dead".to_owned(), 5),
            ("a".to_owned(), "retry".to_owned(), 1),
        ];
        let exact = DoneCounts {
            sent: 7,
            skipped: 1,
            estimate: 0,
        };
        let (counts, types) = status_counts(rows.clone(), &exact);
        assert_eq!((counts.pending, counts.retry, counts.dead), (2, 1, 5));
        assert_eq!(
            (counts.sent, counts.skipped, counts.estimated),
            (7, 1, false)
        );
        assert_eq!(types[0].event_type, "b", "most unsent and dead first");
        let many = DoneCounts {
            sent: EXACT_COUNT_LIMIT,
            skipped: 0,
            estimate: 1_000_000,
        };
        let (counts, _) = status_counts(rows, &many);
        assert!(counts.estimated);
        assert_eq!(counts.sent, 1_000_000 - 8);
    }

    #[test]
    fn a_full_page_names_its_last_key() {
        assert_eq!(page_of(vec![1, 2], 2, |n| *n).next, Some(2));
        assert_eq!(page_of(vec![1], 2, |n| *n).next, None);
    }
}
