//! Names of the metrics the relay emits through the [`metrics`] facade.
//!
//! Install any `metrics` recorder (e.g. `metrics-exporter-prometheus`) to
//! collect them; without one they cost next to nothing.

/// Counter: events confirmed by the broker and marked `Sent`.
pub const PUBLISHED_TOTAL: &str = "outbox_published_total";
/// Counter: failed publish attempts that spent an attempt (nack, unroutable,
/// confirm timeout, refused).
pub const FAILED_TOTAL: &str = "outbox_failed_total";
/// Counter: events that became `Dead`.
pub const DEAD_TOTAL: &str = "outbox_dead_total";
/// Counter: batches interrupted by a lost broker connection (or a broker
/// that confirmed none of a wave's messages).
pub const CONNECTION_LOST_TOTAL: &str = "outbox_connection_lost_total";
/// Counter: messages the broker did not confirm in time (no attempt spent).
pub const UNCONFIRMED_TOTAL: &str = "outbox_unconfirmed_total";
/// Counter: events released with a delay and no attempt spent (unconfirmed,
/// or held back by a destination's open circuit breaker).
pub const HELD_TOTAL: &str = "outbox_held_total";
/// Counter: store (database) errors seen by the relay.
pub const STORE_ERRORS_TOTAL: &str = "outbox_store_errors_total";
/// Histogram: events per claimed batch.
pub const BATCH_SIZE: &str = "outbox_batch_size";
/// Histogram: seconds from claim to finished marks, per batch.
pub const BATCH_DURATION_SECONDS: &str = "outbox_batch_duration_seconds";
/// Histogram: seconds from when an event was raised (its `occurred_at`,
/// set when the application raised it, before its transaction committed)
/// to the broker's confirm of its message, per confirmed event. It spans
/// the application's transaction, the wait in the outbox and the publish;
/// it compares the raising host's clock with the relay's (0 when the
/// relay's is behind).
pub const RAISE_TO_CONFIRM_SECONDS: &str = "outbox_raise_to_confirm_seconds";
/// Gauge: unsent events (`Pending`, `Retry` and `Held`).
pub const BACKLOG: &str = "outbox_backlog";
/// Gauge: age of the oldest unsent event in seconds (0 when none).
pub const OLDEST_UNSENT_AGE_SECONDS: &str = "outbox_oldest_unsent_age_seconds";
/// Gauge: `Dead` events.
pub const DEAD: &str = "outbox_dead";
/// Gauge: aggregates held back by a failing or `Dead` event.
pub const BLOCKED_AGGREGATES: &str = "outbox_blocked_aggregates";
/// Gauge: events held because the broker returned them as unroutable, across
/// every relay of the outbox (read from the store, not counted per process).
pub const UNROUTABLE_EVENTS: &str = "outbox_unroutable_events";
/// Counter: unroutable events marked sent under `UnroutablePolicy::Accept`.
pub const UNROUTABLE_ACCEPTED_TOTAL: &str = "outbox_unroutable_accepted_total";
/// Counter: times an event was counted as a suspect: it was in flight when
/// the broker connection died of a cause not known to be the broker's (see
/// `PublishOutcome::ConnectionDied`).
pub const SUSPECT_EVENTS_TOTAL: &str = "outbox_suspect_events_total";
/// Gauge: 1 while the relay is paused after losing the broker connection.
pub const PAUSED: &str = "outbox_relay_paused";
/// Gauge: 1 while an operator has paused the relay (`outbox relays pause`).
pub const OPERATOR_PAUSED: &str = "outbox_relay_operator_paused";
/// Gauge: relays of the outbox that deliver (a recent heartbeat, not paused
/// by an operator), read from the store (store-wide: every relay exports
/// the same value, so alert on `max`).
pub const RELAYS_LIVE: &str = "outbox_relays_live";

/// Counter: rows the [`Janitor`](crate::admin::Janitor) deleted, labelled
/// `table` (`outbox_events`, `inbox_events`).
pub const PURGED_TOTAL: &str = "outbox_purged_total";

/// Registers descriptions and units of every metric above with the installed
/// recorder. Optional; call it once after installing your recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        PUBLISHED_TOTAL,
        "Events confirmed by the broker and marked sent"
    );
    describe_counter!(
        FAILED_TOTAL,
        "Publish attempts that failed and spent an attempt"
    );
    describe_counter!(
        DEAD_TOTAL,
        "Events that ran out of attempts and became dead"
    );
    describe_counter!(
        CONNECTION_LOST_TOTAL,
        "Batches interrupted by a lost broker connection"
    );
    describe_counter!(
        SUSPECT_EVENTS_TOTAL,
        "Events in flight when the broker connection died (counted as suspects)"
    );
    describe_counter!(STORE_ERRORS_TOTAL, "Outbox store errors seen by the relay");
    describe_histogram!(BATCH_SIZE, Unit::Count, "Events per claimed batch");
    describe_histogram!(
        BATCH_DURATION_SECONDS,
        Unit::Seconds,
        "Claim-to-mark time per batch"
    );
    describe_histogram!(
        RAISE_TO_CONFIRM_SECONDS,
        Unit::Seconds,
        "Time from when an event was raised to the broker's confirm of its message"
    );
    describe_gauge!(BACKLOG, Unit::Count, "Unsent events");
    describe_gauge!(
        OLDEST_UNSENT_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest unsent event"
    );
    describe_gauge!(DEAD, Unit::Count, "Dead events awaiting an operator");
    describe_gauge!(
        BLOCKED_AGGREGATES,
        Unit::Count,
        "Aggregates held back by a failing or dead event"
    );
    describe_gauge!(
        UNROUTABLE_EVENTS,
        Unit::Count,
        "Events held because no queue is bound for their routing key"
    );
    describe_counter!(
        UNROUTABLE_ACCEPTED_TOTAL,
        "Unroutable events marked sent by the Accept policy"
    );
    describe_gauge!(OPERATOR_PAUSED, "1 while an operator has paused the relay");
    describe_gauge!(
        RELAYS_LIVE,
        Unit::Count,
        "Relays of the outbox with a recent heartbeat"
    );
    describe_gauge!(
        PAUSED,
        "1 while the relay is paused after losing the broker connection"
    );
}
