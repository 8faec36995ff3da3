//! The AMQP headers the consumer and the dead-letter queue write on top of
//! the event's own wire format ([`wire`](crate::wire)): attempts and errors
//! of a retried message, why and from where a message was dead-lettered,
//! and why a replayed one had been.

/// Header: which attempt this delivery is (signed 64-bit; absent = 1). Set
/// by the consumer when it republishes a failed message.
pub const ATTEMPT_HEADER: &str = "x-outbox-attempt";
/// Header: the error of the previous attempt, on a retried message.
pub const LAST_ERROR_HEADER: &str = "x-outbox-last-error";
/// Header: why the consumer dead-lettered the message (the decode error, or
/// the last handler error).
pub const DEAD_REASON_HEADER: &str = "x-outbox-dead-reason";
/// Header: the routing key the message first arrived with (a retry travels
/// through the default exchange, keyed by the queue name). The handler sees
/// it as [`IncomingEvent::routing_key`](crate::IncomingEvent::routing_key),
/// and a dead letter is published with it.
///
/// A header that cannot be a routing key (not text, or longer than AMQP's
/// 255 bytes; the consumer never writes one, so another publisher did) is
/// ignored with a warning: the delivery's own routing key is used instead,
/// and replaces the header when the message is retried or dead-lettered.
/// Such a message is handled, retried and dead-lettered like any other,
/// never requeued forever.
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "x-outbox-original-routing-key";
/// Header: the exchange the message first arrived through, for operators
/// who move dead letters back.
pub const ORIGINAL_EXCHANGE_HEADER: &str = "x-outbox-original-exchange";
/// Header: the queue the consumer read a dead letter from, set on every
/// message it dead-letters. A [replay](crate::DeadLetterQueue::replay) sends
/// the message back there, even from a dead-letter queue several queues
/// share.
pub const QUEUE_HEADER: &str = "x-outbox-queue";

/// Header: a fresh id (UUID v7) on every message the consumer dead-letters,
/// recorded with it: a [replay](crate::DeadLetterQueue::replay) reports it,
/// so exactly the records of the messages it moved are marked replayed
/// (other copies of the same event, and undecodable messages, included).
pub const DEAD_LETTER_ID_HEADER: &str = "x-outbox-dead-letter-id";

/// Header: on a replayed message, why it had been dead-lettered (the
/// `x-outbox-dead-reason` it carried).
pub const REPLAYED_REASON_HEADER: &str = "x-outbox-replayed-reason";
