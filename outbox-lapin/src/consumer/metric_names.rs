//! Names of the metrics the [`InboxConsumer`](crate::InboxConsumer) emits
//! through the [`metrics`] facade, each labelled `consumer` = the consumer
//! name.
//!
//! Install any `metrics` recorder (e.g. `metrics-exporter-prometheus`) to
//! collect them; without one they cost next to nothing.

/// Counter: events handled for the first time and committed (then acked).
pub const PROCESSED_TOTAL: &str = "outbox_consumer_processed_total";
/// Counter: deliveries the inbox recognised as already processed (acked
/// without running the handler); in [batch
/// mode](crate::InboxConsumerBuilder::batch), also a second copy of an
/// event in the same batch.
pub const DUPLICATES_TOTAL: &str = "outbox_consumer_duplicates_total";
/// Counter: failed deliveries republished for another attempt.
pub const RETRIED_TOTAL: &str = "outbox_consumer_retried_total";
/// Counter: messages republished to the dead-letter exchange (undecodable,
/// out of attempts, or failed permanently).
pub const DEAD_LETTERED_TOTAL: &str = "outbox_consumer_dead_lettered_total";
/// Counter: deliveries whose transaction could not begin, or whose inbox
/// entry could not be written (the database is unavailable); each is tried
/// again after the retry delay without spending an attempt.
pub const DATABASE_UNAVAILABLE_TOTAL: &str = "outbox_consumer_database_unavailable_total";
/// Counter: broker connections lost (each is followed by a reconnect).
pub const CONNECTION_LOST_TOTAL: &str = "outbox_consumer_connection_lost_total";
/// Gauge: messages ready in the consumer's dead-letter queue, read from the
/// broker (passive `queue.declare`) when a session starts and every 15 s
/// while it lasts. Unlike [`DEAD_LETTERED_TOTAL`] it goes down when dead
/// letters are replayed or purged. Exported only when the consumer knows its
/// dead-letter queue: it [declares](crate::InboxConsumerBuilder::declare) a
/// [`QueueTopology`](crate::QueueTopology) with one, and dead-letters to
/// that topology's exchange. A failed read keeps the last value.
pub const DEAD_LETTERS: &str = "outbox_consumer_dead_letters";
/// Histogram: deliveries a worker gathered into one transaction, in
/// [batch mode](crate::InboxConsumerBuilder::batch) only (recorded for every
/// batch, also one that then fails). Mostly well below the configured
/// `max_deliveries` under load: raise `prefetch`, or lengthen `max_wait`;
/// mostly 1: the consumer keeps up without batching.
pub const BATCH_SIZE: &str = "outbox_consumer_batch_size";
/// Counter: batches that did not commit (a handler error or panic, an inbox
/// or database error, a failed commit) and whose deliveries were then
/// applied one at a time, in [batch mode](crate::InboxConsumerBuilder::batch).
/// Each cost one rolled-back transaction; the failing delivery's own retry
/// or dead letter is counted by [`RETRIED_TOTAL`] or [`DEAD_LETTERED_TOTAL`].
pub const BATCH_FAILURES_TOTAL: &str = "outbox_consumer_batch_failures_total";
/// Histogram: seconds the handler took, per call (the [`EventHandler`]
/// future from its first poll to its result: an error or panic included,
/// the inbox entry and the commit not).
///
/// [`EventHandler`]: crate::EventHandler
pub const HANDLER_DURATION_SECONDS: &str = "outbox_consumer_handler_duration_seconds";
/// Histogram: seconds from when an event was raised (its `occurred_at`, set
/// by the producer when the event was recorded, before its commit) to when
/// this consumer committed its handling, recorded once per event, when it
/// is handled for the first time (not for duplicates).
///
/// It compares the clocks of two hosts: clock skew shifts it (a producer
/// clock ahead reads as 0). Redeliveries after a lost ack, retries and
/// replayed dead letters (an event handled for the first time long after
/// it was raised) lengthen its tail: read it as end-to-end latency of the
/// whole chain (commit, relay, broker, queueing, retries), not of one hop.
pub const RAISE_TO_HANDLED_SECONDS: &str = "outbox_consumer_raise_to_handled_seconds";

/// Registers descriptions of every metric above with the installed
/// recorder. Optional; call it once after installing your recorder.
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        PROCESSED_TOTAL,
        "Events handled for the first time and committed by an inbox consumer"
    );
    describe_counter!(
        DUPLICATES_TOTAL,
        "Deliveries an inbox consumer acknowledged as duplicates without running the handler"
    );
    describe_counter!(
        RETRIED_TOTAL,
        "Failed deliveries an inbox consumer republished for another attempt"
    );
    describe_counter!(
        DEAD_LETTERED_TOTAL,
        "Messages an inbox consumer republished to its dead-letter exchange"
    );
    describe_counter!(
        DATABASE_UNAVAILABLE_TOTAL,
        "Deliveries an inbox consumer retried in place because its database was unavailable"
    );
    describe_counter!(
        CONNECTION_LOST_TOTAL,
        "Broker connections an inbox consumer lost and re-established"
    );
    describe_gauge!(
        DEAD_LETTERS,
        Unit::Count,
        "Messages waiting in an inbox consumer's dead-letter queue"
    );
    describe_histogram!(
        BATCH_SIZE,
        Unit::Count,
        "Deliveries an inbox consumer's worker applied in one transaction (batch mode)"
    );
    describe_counter!(
        BATCH_FAILURES_TOTAL,
        "Batches an inbox consumer rolled back and applied again one delivery at a time"
    );
    describe_histogram!(
        HANDLER_DURATION_SECONDS,
        Unit::Seconds,
        "Time an inbox consumer's handler took per call"
    );
    describe_histogram!(
        RAISE_TO_HANDLED_SECONDS,
        Unit::Seconds,
        "Time from an event being raised (producer clock) to its first handling committed by an \
         inbox consumer (consumer clock)"
    );
}
