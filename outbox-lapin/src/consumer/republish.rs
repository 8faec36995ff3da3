//! Republishing a delivery (for a retry or to the dead-letter exchange) on
//! a confirm-mode channel, reopened if the broker closed it.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use crate::topology::short_string;
use crate::{Error, Result};

/// Longest header text (error messages) put on a republished message, in
/// bytes; longer texts are cut at a character boundary.
const MAX_HEADER_TEXT: usize = 2048;

/// Publishes copies of deliveries with publisher confirms.
pub(crate) struct Republisher {
    connection: Arc<Connection>,
    channel: Mutex<Channel>,
    confirm_timeout: Duration,
}

impl Republisher {
    /// Opens a confirm-mode channel on `connection`.
    pub(crate) async fn open(
        connection: Arc<Connection>,
        confirm_timeout: Duration,
    ) -> Result<Self> {
        let channel = confirm_channel(&connection).await?;
        Ok(Republisher {
            connection,
            channel: Mutex::new(channel),
            confirm_timeout,
        })
    }

    /// The confirm-mode channel, reopened when the broker closed it (e.g.
    /// after a publish to an exchange that no longer exists).
    async fn channel(&self) -> Result<Channel> {
        let mut channel = self.channel.lock().await;
        if !channel.status().connected() {
            *channel = confirm_channel(&self.connection).await?;
        }
        Ok(channel.clone())
    }

    /// Publishes `body` with `properties` to `exchange` / `routing_key`
    /// (`mandatory`) and waits for the confirm. `Err` says why the message
    /// cannot be counted as stored: a nack, a return (no queue bound), a
    /// timeout or a channel/connection error.
    pub(crate) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> std::result::Result<(), RepublishError> {
        use RepublishError::{Failed, Refused};
        let target = format!("exchange `{exchange}` with routing key `{routing_key}`");
        let exchange =
            short_string("exchange name", exchange).map_err(|e| Refused(e.to_string()))?;
        let routing_key =
            short_string("routing key", routing_key).map_err(|e| Refused(e.to_string()))?;
        // Opening the channel and sending are bounded too: on a connection
        // that is going away they could otherwise wait forever.
        let sending = async {
            let channel = self.channel().await.map_err(|e| Failed(e.to_string()))?;
            channel
                .basic_publish(
                    exchange,
                    routing_key,
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    body,
                    properties,
                )
                .await
                .map_err(|e| Failed(format!("publishing to {target} failed: {e}")))
        };
        let confirm = tokio::time::timeout(self.confirm_timeout, sending)
            .await
            .map_err(|_| {
                Failed(format!(
                    "publishing to {target} did not complete within {:?}",
                    self.confirm_timeout
                ))
            })??;
        match tokio::time::timeout(self.confirm_timeout, confirm).await {
            Err(_) => Err(Failed(format!(
                "no confirm for the publish to {target} within {:?}",
                self.confirm_timeout
            ))),
            Ok(Err(e)) => Err(Failed(format!("publishing to {target} failed: {e}"))),
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(Refused(format!(
                "the broker returned the message published to {target}: {} {} (no queue is bound \
                 for it)",
                returned.reply_code, returned.reply_text
            ))),
            // A nack is the broker's state (a full queue that rejects
            // publishes, a quorum queue without its quorum), not the message's.
            Ok(Ok(Confirmation::Nack(_))) => {
                Err(Failed(format!("the broker nacked the publish to {target}")))
            }
            Ok(Ok(Confirmation::NotRequested)) => Err(Failed(format!(
                "the publish to {target} was not confirmed (channel not in confirm mode)"
            ))),
        }
    }
}

/// Why a republish failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RepublishError {
    /// The broker refused this message (returned as unroutable, an invalid
    /// name): another message may go through.
    Refused(String),
    /// The broker did not take it (connection, channel, a nack, no confirm
    /// in time): nothing may go through now.
    Failed(String),
}

impl std::fmt::Display for RepublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RepublishError::Refused(why) | RepublishError::Failed(why) => f.write_str(why),
        }
    }
}

async fn confirm_channel(connection: &Connection) -> Result<Channel> {
    let channel = connection
        .create_channel()
        .await
        .map_err(Error::amqp("open the republish channel"))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(Error::amqp(
            "enable publisher confirms on the republish channel",
        ))?;
    Ok(channel)
}

/// An AMQP long string header value, cut to [`MAX_HEADER_TEXT`] bytes.
pub(crate) fn text(value: &str) -> AMQPValue {
    let mut end = value.len().min(MAX_HEADER_TEXT);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    AMQPValue::LongString(LongString::from(&value[..end]))
}

/// `properties` with `headers` set (replacing same-named ones); everything
/// else (message id, type, timestamp, delivery mode, …) unchanged.
pub(crate) fn with_headers(
    properties: &BasicProperties,
    headers: impl IntoIterator<Item = (&'static str, AMQPValue)>,
) -> BasicProperties {
    let mut table: FieldTable = properties.headers().clone().unwrap_or_default();
    for (key, value) in headers {
        // Our header names are short constants, far below the 255-byte limit.
        table.insert(ShortString::from(key), value);
    }
    properties.clone().with_headers(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_is_cut_at_a_char_boundary() {
        let long = "é".repeat(MAX_HEADER_TEXT);
        let AMQPValue::LongString(cut) = text(&long) else {
            panic!("a long string")
        };
        assert!(cut.as_bytes().len() <= MAX_HEADER_TEXT);
        assert!(std::str::from_utf8(cut.as_bytes()).is_ok());
    }

    #[test]
    fn with_headers_keeps_the_other_properties() {
        let props = BasicProperties::default()
            .with_message_id("m".into())
            .with_headers(FieldTable::from(std::collections::BTreeMap::from([(
                ShortString::from("keep"),
                AMQPValue::Boolean(true),
            )])));
        let out = with_headers(&props, [("x-outbox-attempt", AMQPValue::LongLongInt(2))]);
        assert_eq!(out.message_id().as_ref().map(|m| m.as_str()), Some("m"));
        let headers = out.headers().as_ref().unwrap();
        assert_eq!(headers.inner().get("keep"), Some(&AMQPValue::Boolean(true)));
        assert_eq!(
            headers.inner().get("x-outbox-attempt"),
            Some(&AMQPValue::LongLongInt(2))
        );
    }
}
