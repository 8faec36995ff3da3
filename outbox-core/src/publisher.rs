//! The broker side: [`Publisher`] and the per-message [`PublishOutcome`].

use std::future::Future;
use std::time::Instant;

use crate::EventEnvelope;

/// What the broker said about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishOutcome {
    /// Confirmed by the broker (`basic.ack`, not returned): the event may be
    /// marked `Sent`.
    Acked,
    /// The broker refused this message (nack, unroutable return, a channel
    /// closed by the broker because of it). Spends an attempt.
    Rejected {
        /// A reason a person can act on, stored as the event's `last_error`.
        reason: String,
    },
    /// The broker returned the message as unroutable (`312 NO_ROUTE`): no
    /// queue is bound for its routing key. Usually a configuration fault
    /// (a missing binding), or "no subscriber yet" in pub/sub, rarely the
    /// message's: what it costs is the relay's
    /// [`UnroutablePolicy`](crate::UnroutablePolicy) for its event type.
    Unroutable {
        /// What the broker said, with the exchange and routing key.
        reason: String,
    },
    /// The message can never be published as it is (it breaks a limit of
    /// the wire format, e.g. an over-long header name stored by another
    /// writer), so it was not sent. Spends an attempt and ends the event
    /// `Dead` at once, without the retry schedule; replay it once fixed.
    Unpublishable {
        /// What is wrong with it, stored as the event's `last_error`.
        reason: String,
    },
    /// The connection was lost before the message was confirmed; nothing is
    /// known about it. Spends no attempt: the relay pauses and tries again.
    ConnectionLost {
        /// What happened to the connection.
        reason: String,
    },
    /// The connection died while this message was in flight (sent, not yet
    /// confirmed), of a cause not known to be the broker's own: an I/O error
    /// or an abrupt close, not a close the broker announced (e.g. `320
    /// CONNECTION_FORCED`), a resource alarm or a confirm timeout. Nothing
    /// is known about the message, and it may be what killed the
    /// connection (a proxy or broker plugin that drops the connection on
    /// it). Spends no attempt and pauses the relay like
    /// [`ConnectionLost`](Self::ConnectionLost); the relay also counts the
    /// event as a suspect in its row, publishes it alone from then on, and
    /// parks it `Dead` once the connection died with it alone in flight at
    /// the relay's [`suspect_limit`](crate::RelayBuilder::suspect_limit).
    ConnectionDied {
        /// What happened to the connection.
        reason: String,
    },
    /// The message was sent but the broker did not confirm it in time (or
    /// its confirm cannot be trusted). A broker answers a bad message with
    /// a nack, a return or a channel error, never with silence, so this is
    /// never the message's fault and spends no attempt: a whole wave
    /// unconfirmed across destinations pauses the relay (broker
    /// unavailable); otherwise the event is released with a capped backoff
    /// behind a circuit breaker for its [destination](Publisher::destination).
    Unconfirmed {
        /// What was waited for, and how long.
        reason: String,
    },
}

impl PublishOutcome {
    /// A [`PublishOutcome::Rejected`] with `reason`.
    pub fn rejected(reason: impl Into<String>) -> Self {
        PublishOutcome::Rejected {
            reason: reason.into(),
        }
    }

    /// A [`PublishOutcome::Unroutable`] with `reason`.
    pub fn unroutable(reason: impl Into<String>) -> Self {
        PublishOutcome::Unroutable {
            reason: reason.into(),
        }
    }

    /// A [`PublishOutcome::Unpublishable`] with `reason`.
    pub fn unpublishable(reason: impl Into<String>) -> Self {
        PublishOutcome::Unpublishable {
            reason: reason.into(),
        }
    }

    /// A [`PublishOutcome::ConnectionLost`] with `reason`.
    pub fn connection_lost(reason: impl Into<String>) -> Self {
        PublishOutcome::ConnectionLost {
            reason: reason.into(),
        }
    }

    /// A [`PublishOutcome::ConnectionDied`] with `reason`.
    pub fn connection_died(reason: impl Into<String>) -> Self {
        PublishOutcome::ConnectionDied {
            reason: reason.into(),
        }
    }

    /// A [`PublishOutcome::Unconfirmed`] with `reason`.
    pub fn unconfirmed(reason: impl Into<String>) -> Self {
        PublishOutcome::Unconfirmed {
            reason: reason.into(),
        }
    }
}

/// Sends events to a broker and reports one [`PublishOutcome`] per event.
///
/// Implementations publish the whole slice pipelined (without waiting for one
/// confirm before sending the next message) and then wait for every confirm,
/// at most until the shorter of their own confirm timeout and `deadline`:
/// the relay passes its claim's [`valid_until`](crate::Claim::valid_until),
/// after which the claim may lapse and nothing could be marked. A message
/// not confirmed by then is [`PublishOutcome::Unconfirmed`].
/// The returned vector has one outcome per input event, in input order; the
/// relay treats a missing outcome as `ConnectionLost` (nothing is marked).
///
/// Implementation: `outbox-lapin`'s `LapinPublisher` (RabbitMQ); for tests,
/// `testing::RecordingPublisher` (feature `test-util`).
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `events` and waits for their confirms, until `deadline`
    /// at the latest (`None`: the publisher's own confirm timeout only).
    fn publish(
        &self,
        events: &[&EventEnvelope],
        deadline: Option<Instant>,
    ) -> impl Future<Output = Vec<PublishOutcome>> + Send;

    /// Where `event` goes, as a name: the key of the relay's circuit
    /// breaker for [`PublishOutcome::Unconfirmed`] messages, so that one
    /// destination that stops confirming (a stuck queue) delays only the
    /// events sent there. Events with the same destination should reach the
    /// same queues (for RabbitMQ: exchange and routing key). Default: the
    /// event type.
    fn destination(&self, event: &EventEnvelope) -> String {
        event.event_type.clone()
    }
}
