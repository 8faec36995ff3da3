//! Sorting a lapin error on a message: connection lost (nothing spent),
//! connection died under it (a suspect), or channel closed because of a
//! message (narrow the batch down).

use lapin::protocol::{AMQPErrorKind, AMQPHardError};
use lapin::{ConnectionStatus, ErrorKind};
use outbox_core::PublishOutcome;

use super::confirm::Round;

/// Sorts a lapin error into "connection lost" (spends nothing), "the
/// connection died under this message" (spends nothing, but makes it a
/// suspect) or "the broker closed the channel" (a message caused it: narrow
/// it down). `sent` tells whether the message went out (the error is its
/// confirm's) or not (the error is its `basic.publish`'s).
///
/// A connection closed by the broker is sorted by its reply code: 501
/// (frame error), 502 (syntax error) and 505 (unexpected frame) are about
/// a frame this publisher sent, so about a message (narrow it down, as for
/// a channel error); 541 (internal error) may be a message's too (a broker
/// plugin failing on it), so the messages in flight are
/// [`PublishOutcome::ConnectionDied`]; 320 (forced: an operator or a
/// broker shutting down) and the other codes are the broker's (connection
/// lost). A connection that ended without a reply code (an I/O error, an
/// abrupt close: e.g. a proxy that drops it on a message) is
/// `ConnectionDied` for the messages in flight, except when heartbeats
/// stopped (the broker or the network went silent, as for a confirm
/// timeout: connection lost).
pub(super) fn classify(connection: &ConnectionStatus, err: &lapin::Error, sent: bool) -> Round {
    let lost = |reason: String| Round::Done(PublishOutcome::connection_lost(reason));
    let died = |reason: String| {
        if sent {
            Round::Done(PublishOutcome::connection_died(reason))
        } else {
            lost(reason)
        }
    };
    if let ErrorKind::ProtocolError(amqp) = err.kind()
        && let AMQPErrorKind::Hard(hard) = amqp.kind()
    {
        return match hard {
            AMQPHardError::FRAMEERROR
            | AMQPHardError::SYNTAXERROR
            | AMQPHardError::UNEXPECTEDFRAME => Round::ChannelClosed(format!(
                "the broker closed the connection because of a frame sent for this message: \
                 {} {}",
                amqp.get_id(),
                amqp.get_message()
            )),
            AMQPHardError::INTERNALERROR => died(format!(
                "the broker closed the connection with an internal error while this message \
                 was in flight: {amqp}"
            )),
            _ => lost(format!("connection closed by the broker: {amqp}")),
        };
    }
    if matches!(err.kind(), ErrorKind::MissingHeartbeatError) {
        return lost(format!("connection to RabbitMQ lost: {err}"));
    }
    // The broker's verdict on a channel (404, 406, ...) is about a message
    // even when the connection went down right after (lapin's close race,
    // see the type's docs): narrow it down, do not count it a suspect.
    if let ErrorKind::ProtocolError(amqp) = err.kind()
        && let AMQPErrorKind::Soft(_) = amqp.kind()
    {
        return Round::ChannelClosed(format!(
            "channel closed by the broker: {} {}",
            amqp.get_id(),
            amqp.get_message()
        ));
    }
    if !connection.connected() {
        return died(format!(
            "the connection to RabbitMQ died while this message was in flight: {err}"
        ));
    }
    match err.kind() {
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(_) => Round::ChannelClosed(format!(
                "channel closed by the broker: {} {}",
                amqp.get_id(),
                amqp.get_message()
            )),
            AMQPErrorKind::Hard(_) => lost(format!("connection closed by the broker: {amqp}")),
        },
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidChannel(_) => {
            Round::ChannelClosed(format!("channel closed by the broker: {err}"))
        }
        ErrorKind::IOError(_) => died(format!(
            "the connection to RabbitMQ failed while this message was in flight: {err}"
        )),
        _ => lost(format!("connection to RabbitMQ failed: {err}")),
    }
}
