//! Declaring exchanges, queues, bindings and dead-lettering, so applications
//! do not hand-write AMQP topology.
//!
//! Every declaration here is idempotent: declaring what already exists with
//! the same settings is a no-op, so services can declare their topology at
//! each start. Declaring an existing exchange or queue with *different*
//! settings (another kind, durability or queue arguments) is refused by the
//! broker with `406 PRECONDITION_FAILED`, which closes the channel: delete
//! the old one first or keep the settings.
//!
//! ```no_run
//! use outbox_lapin::{AmqpUrls, QueueTopology, QueueType};
//!
//! # async fn run() -> outbox_lapin::Result<()> {
//! // One URL, or every node of a cluster, comma-separated.
//! let connection = AmqpUrls::from("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .connect("billing-setup")
//!     .await?;
//! let channel = connection
//!     .create_channel()
//!     .await
//!     .map_err(|source| outbox_lapin::Error::Amqp { operation: "open channel".into(), source })?;
//!
//! // Queue `billing.orders` gets `order.placed` and every `inventory.*` event
//! // from the topic exchange `shop`; messages the consumer gives up on go to
//! // `billing.orders.dlx` and from there to the queue `billing.orders.dead`.
//! // A quorum queue (replicated: the recommended type, see `QueueType`).
//! let topology = QueueTopology::new("billing.orders")
//!     .queue_type(QueueType::Quorum)
//!     .exchange("shop")
//!     .bind("order.placed")
//!     .bind("inventory.*");
//! topology.declare(&channel).await?;
//! assert_eq!(topology.dead_letter_exchange_name(), Some("billing.orders.dlx"));
//! assert_eq!(topology.dead_letter_queue_name(), Some("billing.orders.dead"));
//! # Ok(()) }
//! ```

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::{Error, Result};

/// Queue argument naming the queue's dead-letter exchange.
const X_DEAD_LETTER_EXCHANGE: &str = "x-dead-letter-exchange";
/// Queue argument choosing the queue type.
const X_QUEUE_TYPE: &str = "x-queue-type";
/// Queue argument of quorum queues: deliveries before the broker
/// dead-letters a message.
const X_DELIVERY_LIMIT: &str = "x-delivery-limit";
/// Queue argument of quorum queues: how the broker dead-letters
/// (`at-most-once`, its default, or `at-least-once`).
const X_DEAD_LETTER_STRATEGY: &str = "x-dead-letter-strategy";
/// Queue argument: what a full queue does with a new message
/// (`reject-publish` is required by `at-least-once` dead-lettering).
const X_OVERFLOW: &str = "x-overflow";

/// The type of a [`QueueTopology`]'s queues (the `x-queue-type` argument).
///
/// **Quorum queues are the recommended type**, on a single node as on a
/// cluster: they are replicated (Raft) over the cluster's nodes, so a queue
/// stays available and keeps its messages while a minority of nodes is down
/// (one of three), and their publisher confirms are sent only once a
/// majority has the message on disk. A classic queue lives on one node:
/// while that node is down the queue is unavailable (publishes to it are
/// unroutable or refused, its consumer cannot subscribe). Quorum queues
/// must be durable, and cannot be exclusive or auto-deleted.
///
/// Classic stays the default because an existing queue cannot change type:
/// re-declaring a classic queue as quorum is refused by the broker with
/// `406 PRECONDITION_FAILED` (`inequivalent arg 'x-queue-type'`). Migrate
/// by declaring a new quorum queue, binding it, draining the old one and
/// deleting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueType {
    /// A classic queue (`x-queue-type` = `classic`), on one node.
    #[default]
    Classic,
    /// A quorum queue (`x-queue-type` = `quorum`), replicated over a
    /// majority of the cluster's nodes.
    Quorum,
}

impl QueueType {
    /// The `x-queue-type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        }
    }
}

/// `name` as an AMQP short string, or [`Error::Config`] when it is longer
/// than the protocol's 255 bytes.
pub(crate) fn short_string(what: &str, name: &str) -> Result<ShortString> {
    ShortString::try_new(name).map_err(|_| {
        Error::Config(format!(
            "{what} `{name}` is longer than 255 bytes, the AMQP limit"
        ))
    })
}

fn exchange_kind_name(kind: &ExchangeKind) -> &str {
    match kind {
        ExchangeKind::Custom(name) => name,
        ExchangeKind::Direct => "direct",
        ExchangeKind::Fanout => "fanout",
        ExchangeKind::Headers => "headers",
        ExchangeKind::Topic => "topic",
    }
}

/// Declares a durable exchange `name` of `kind` (not auto-deleted, not
/// internal). Idempotent.
///
/// The outbox publishes to a topic exchange ([`ExchangeKind::Topic`]) with
/// the event type as routing key, so consumers can bind `order.placed` or
/// `order.*`.
///
/// # Errors
/// [`Error::Config`] for a name longer than 255 bytes, [`Error::Amqp`] if
/// the broker refuses (e.g. the exchange exists with another kind).
pub async fn declare_exchange(channel: &Channel, name: &str, kind: ExchangeKind) -> Result<()> {
    let kind_name = exchange_kind_name(&kind).to_owned();
    channel
        .exchange_declare(
            short_string("exchange name", name)?,
            kind,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(Error::amqp(format!(
            "declare {kind_name} exchange `{name}`"
        )))
}

/// A consumer's queue with its bindings and dead-lettering, declared in one
/// call with [`declare`](Self::declare).
///
/// | setting | default |
/// |---|---|
/// | [`exchange`](Self::exchange) (where [`bind`](Self::bind) patterns apply) | none: set it before `bind` |
/// | [`exchange_kind`](Self::exchange_kind) of declared exchanges | [`ExchangeKind::Topic`] |
/// | [`durable`](Self::durable) queue(s) | `true` |
/// | [`queue_type`](Self::queue_type) of the queue and dead-letter queue | [`QueueType::Classic`]; [`QueueType::Quorum`] recommended |
/// | [`delivery_limit`](Self::delivery_limit) (quorum only, needs a dead-letter exchange) | none (RabbitMQ 4.0+: 20, see there) |
/// | [`dead_letter_exchange`](Self::dead_letter_exchange) | `<queue>.dlx`, a durable topic exchange |
/// | [`dead_letter_queue`](Self::dead_letter_queue) | `<queue>.dead`, bound to the dead-letter exchange with `#` |
///
/// [`declare`](Self::declare) declares, in this order: every exchange named
/// in a binding, the dead-letter exchange, the dead-letter queue and its
/// binding, the queue (with the argument `x-dead-letter-exchange`, so
/// messages the broker itself dead-letters — rejected without requeue,
/// expired, or over a quorum queue's `x-delivery-limit` — land in the same
/// place), and the queue's bindings.
///
/// A quorum queue with a dead-letter exchange also gets
/// `x-dead-letter-strategy` = `at-least-once` and `x-overflow` =
/// `reject-publish` (RabbitMQ 3.10+): with the broker's default
/// (`at-most-once`) a message it dead-letters (over the delivery limit,
/// rejected, expired) is **dropped** when the dead-letter exchange routes it
/// nowhere or the dead-letter queue refuses it (deleted, full with
/// `reject-publish`); at-least-once keeps it in the queue, out of the
/// consumers' reach, until a dead-letter queue confirms it (the broker
/// retries every few minutes). The price: the queue refuses publishes
/// (`basic.nack`) rather than dropping its oldest message if it has an
/// `x-max-length`. Set either argument with [`argument`](Self::argument)
/// to keep your own. A quorum queue declared without them (by an earlier
/// version) is refused with `406 PRECONDITION_FAILED` (`inequivalent arg`)
/// naming the queue: delete and re-declare it, or migrate as for a type
/// change (see [`QueueType`]).
///
/// One dead-letter exchange per queue (the default) keeps the dead-letter
/// queue free of other queues' messages: the
/// [`InboxConsumer`](crate::InboxConsumer) republishes a dead message with
/// its original routing key, and the dead-letter queue is bound with `#`.
#[derive(Debug, Clone)]
pub struct QueueTopology {
    queue: String,
    exchange: Option<String>,
    exchange_kind: ExchangeKind,
    bindings: Vec<(String, String)>,
    /// Mistakes found by the builder methods, reported by `validate`.
    deferred_errors: Vec<String>,
    dead_letter: Option<(String, String)>,
    durable: bool,
    queue_type: QueueType,
    delivery_limit: Option<u32>,
    arguments: FieldTable,
}

impl QueueTopology {
    /// The topology of queue `queue`, with the defaults above.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        let dead_letter = Some((format!("{queue}.dlx"), format!("{queue}.dead")));
        QueueTopology {
            queue,
            exchange: None,
            exchange_kind: ExchangeKind::Topic,
            bindings: Vec::new(),
            deferred_errors: Vec::new(),
            dead_letter,
            durable: true,
            queue_type: QueueType::Classic,
            delivery_limit: None,
            arguments: FieldTable::default(),
        }
    }

    /// The exchange that following [`bind`](Self::bind) calls bind to
    /// (declared as [`exchange_kind`](Self::exchange_kind), durable).
    #[must_use]
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.exchange = Some(name.into());
        self
    }

    /// The kind of every exchange this topology declares, except the
    /// dead-letter exchange (always topic). Default: [`ExchangeKind::Topic`].
    #[must_use]
    pub fn exchange_kind(mut self, kind: ExchangeKind) -> Self {
        self.exchange_kind = kind;
        self
    }

    /// Binds the queue to the current [`exchange`](Self::exchange) with
    /// `pattern`: an event type such as `order.placed`, or a topic pattern
    /// (`inventory.*` is one word after `inventory.`, `#` is zero or more
    /// words). A `bind` before any `exchange` is reported by
    /// [`declare`](Self::declare).
    #[must_use]
    pub fn bind(mut self, pattern: impl Into<String>) -> Self {
        match &self.exchange {
            Some(exchange) => self.bindings.push((exchange.clone(), pattern.into())),
            None => {
                let pattern = pattern.into();
                self.deferred_errors.push(format!(
                    "binding `{pattern}` of queue `{}` has no exchange: call `.exchange(name)` \
                     before `.bind(pattern)`, or use `.bind_to(exchange, pattern)`",
                    self.queue
                ));
            }
        }
        self
    }

    /// Binds the queue to `exchange` with `pattern`, whatever the current
    /// [`exchange`](Self::exchange) is.
    #[must_use]
    pub fn bind_to(mut self, exchange: impl Into<String>, pattern: impl Into<String>) -> Self {
        self.bindings.push((exchange.into(), pattern.into()));
        self
    }

    /// The dead-letter exchange (a durable topic exchange). Default
    /// `<queue>.dlx`. Give every queue its own, or its dead-letter queue
    /// also receives other queues' dead messages.
    #[must_use]
    pub fn dead_letter_exchange(mut self, name: impl Into<String>) -> Self {
        let queue = match self.dead_letter.take() {
            Some((_, queue)) => queue,
            None => format!("{}.dead", self.queue),
        };
        self.dead_letter = Some((name.into(), queue));
        self
    }

    /// The dead-letter queue, bound to the dead-letter exchange with `#`.
    /// Default `<queue>.dead`.
    #[must_use]
    pub fn dead_letter_queue(mut self, name: impl Into<String>) -> Self {
        let exchange = match self.dead_letter.take() {
            Some((exchange, _)) => exchange,
            None => format!("{}.dlx", self.queue),
        };
        self.dead_letter = Some((exchange, name.into()));
        self
    }

    /// Declares no dead-letter exchange or queue (and no
    /// `x-dead-letter-exchange` argument). The consumer still needs a
    /// dead-letter exchange: declare it elsewhere.
    #[must_use]
    pub fn without_dead_letter(mut self) -> Self {
        self.dead_letter = None;
        self
    }

    /// Whether the queue and dead-letter queue survive a broker restart
    /// (default `true`). Exchanges are always durable.
    #[must_use]
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// The type of the queue and of the dead-letter queue (`x-queue-type`).
    /// Default [`QueueType::Classic`]; [`QueueType::Quorum`] is recommended
    /// (see [`QueueType`]), and needed for the queue to survive the loss of
    /// a node of a cluster. A quorum topology must stay
    /// [`durable`](Self::durable).
    #[must_use]
    pub fn queue_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
        self
    }

    /// How many times a message of the (quorum) queue may come back
    /// unacked before the broker dead-letters it itself (`x-delivery-limit`):
    /// with a limit of `n` it is delivered at most `1 + n` times, then goes
    /// to the topology's dead-letter exchange with an `x-death` header
    /// (`x-first-death-reason` = `delivery_limit`), at least once (see the
    /// type's docs). Quorum queues only: on a classic queue
    /// [`validate`](Self::validate) refuses it, and so it does with
    /// [`without_dead_letter`](Self::without_dead_letter) (the broker would
    /// drop the message at the limit). Default none.
    ///
    /// **RabbitMQ 4.0 and later give every quorum queue a delivery limit of
    /// 20 when none is set** (3.x has none): on 4.x a quorum queue always
    /// has one, which is why this topology always gives a quorum queue a
    /// dead-letter exchange unless told otherwise. The dead-letter queue
    /// itself has no dead-letter exchange: on 4.x a dead message read from
    /// it and returned unacked 20 times (a tool that `basic.get`s without
    /// acking, a replay that keeps failing mid-way) would be dropped.
    /// [`DeadLetterQueue`](crate::DeadLetterQueue) acks what it replays
    /// only once the copy is confirmed, so such returns are rare; give the
    /// dead-letter queue a policy with a higher `delivery-limit` if tools
    /// browse it often. (This crate is tested against RabbitMQ 3.10 only;
    /// the 4.x behaviour is from RabbitMQ's documentation.)
    ///
    /// **It does not replace the consumer's
    /// [`max_attempts`](crate::InboxConsumerBuilder::max_attempts)**, which
    /// counts handler failures: the [`InboxConsumer`](crate::InboxConsumer)
    /// never rejects a message to retry it, it acks it and republishes a
    /// copy with `x-outbox-attempt` + 1 (a new message, whose delivery count
    /// starts again at 0). What the broker counts (its `x-delivery-count`
    /// header on redeliveries) are deliveries that came back unacked: the
    /// consumer's connection lost or its process killed while handling
    /// them, a shutdown returning prefetched deliveries, a retry whose
    /// republish was not confirmed. That is what the limit is good for: a
    /// message that **crashes or hangs the consumer process** (an abort, an
    /// out-of-memory kill) is redelivered forever and never reaches its
    /// attempt limit, since the attempt is never counted; the delivery limit
    /// stops that loop. Set it well above the number of connection losses a
    /// healthy message may live through (every unacked delivery of a lost
    /// connection counts one, e.g. at each node loss of a cluster): 20 or
    /// more, as a backstop. The consumer does not read `x-delivery-count`.
    /// A retry whose republish was not confirmed (the broker unavailable)
    /// returns the delivery unacked and so counts one too: at the limit it
    /// goes to the dead-letter queue rather than being retried again.
    ///
    /// Messages the broker dead-letters this way skip the consumer: they
    /// are not recorded in the inbox's dead letters, and they carry the
    /// broker's `x-death` header instead of `x-outbox-dead-reason`
    /// ([`DeadLetterQueue::replay`](crate::DeadLetterQueue::replay) reads
    /// their origin queue from it).
    #[must_use]
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = Some(limit);
        self
    }

    /// Adds a queue argument (e.g. `x-max-length`). Applies to the queue
    /// only, not the dead-letter queue. Prefer
    /// [`queue_type`](Self::queue_type) and
    /// [`delivery_limit`](Self::delivery_limit) over setting `x-queue-type`
    /// and `x-delivery-limit` here: those are checked.
    #[must_use]
    pub fn argument(mut self, key: &str, value: AMQPValue) -> Self {
        match ShortString::try_new(key) {
            Ok(key) => {
                self.arguments.insert(key, value);
            }
            Err(_) => self
                .deferred_errors
                .push(format!("queue argument `{key}` is longer than 255 bytes")),
        }
        self
    }

    /// Whether [`argument`](Self::argument) set `key`.
    fn has_argument(&self, key: &str) -> bool {
        self.arguments
            .inner()
            .keys()
            .any(|name| name.as_str() == key)
    }

    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// The dead-letter exchange, unless [`without_dead_letter`](Self::without_dead_letter).
    pub fn dead_letter_exchange_name(&self) -> Option<&str> {
        self.dead_letter
            .as_ref()
            .map(|(exchange, _)| exchange.as_str())
    }

    /// The dead-letter queue, unless [`without_dead_letter`](Self::without_dead_letter).
    pub fn dead_letter_queue_name(&self) -> Option<&str> {
        self.dead_letter.as_ref().map(|(_, queue)| queue.as_str())
    }

    /// `(exchange, pattern)` of every binding of the queue.
    pub fn bindings(&self) -> impl Iterator<Item = (&str, &str)> {
        self.bindings.iter().map(|(e, p)| (e.as_str(), p.as_str()))
    }

    /// Checks the settings without a broker: names fit AMQP, every `bind`
    /// follows an `exchange`.
    ///
    /// # Errors
    /// [`Error::Config`] saying what is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.queue.is_empty() {
            return Err(Error::Config(
                "the queue name is empty (a server-named queue cannot be shared by consumers)"
                    .into(),
            ));
        }
        if let Some(error) = self.deferred_errors.first() {
            return Err(Error::Config(error.clone()));
        }
        short_string("queue name", &self.queue)?;
        for (exchange, pattern) in &self.bindings {
            short_string("exchange name", exchange)?;
            short_string("binding pattern", pattern)?;
            if exchange.is_empty() {
                return Err(Error::Config(
                    "cannot bind to the default exchange (\"\"): it routes by queue name already"
                        .into(),
                ));
            }
        }
        if self.queue_type == QueueType::Quorum && !self.durable {
            return Err(Error::Config(format!(
                "queue `{}`: a quorum queue must be durable; remove `.durable(false)` or use \
                 QueueType::Classic",
                self.queue
            )));
        }
        if self.delivery_limit.is_some() && self.dead_letter.is_none() {
            return Err(Error::Config(format!(
                "queue `{}`: a delivery limit (`x-delivery-limit`) without a dead-letter \
                 exchange makes the broker drop a message at the limit; remove \
                 `.without_dead_letter()` or the delivery limit",
                self.queue
            )));
        }
        if self.delivery_limit.is_some() && self.queue_type != QueueType::Quorum {
            return Err(Error::Config(format!(
                "queue `{}`: a delivery limit (`x-delivery-limit`) needs a quorum queue; add \
                 `.queue_type(QueueType::Quorum)` (classic queues do not count deliveries)",
                self.queue
            )));
        }
        if let Some((exchange, queue)) = &self.dead_letter {
            short_string("dead-letter exchange name", exchange)?;
            short_string("dead-letter queue name", queue)?;
            if exchange.is_empty() || queue.is_empty() {
                return Err(Error::Config(
                    "the dead-letter exchange and queue names must not be empty".into(),
                ));
            }
        }
        Ok(())
    }

    /// Declares the exchanges, the dead-letter exchange and queue, the queue
    /// and its bindings (see the type's docs). Idempotent.
    ///
    /// # Errors
    /// [`Error::Config`] as [`validate`](Self::validate); [`Error::Amqp`]
    /// naming the declaration the broker refused (the channel is then
    /// closed: open a new one).
    pub async fn declare(&self, channel: &Channel) -> Result<()> {
        self.validate()?;
        let mut declared: Vec<&str> = Vec::new();
        for (exchange, _) in &self.bindings {
            if !declared.contains(&exchange.as_str()) {
                declare_exchange(channel, exchange, self.exchange_kind.clone()).await?;
                declared.push(exchange);
            }
        }
        let queue_options = QueueDeclareOptions {
            durable: self.durable,
            ..QueueDeclareOptions::default()
        };
        let mut arguments = self.arguments.clone();
        let mut type_only = FieldTable::default();
        if self.queue_type != QueueType::Classic {
            for table in [&mut arguments, &mut type_only] {
                table.insert(
                    X_QUEUE_TYPE.into(),
                    AMQPValue::LongString(LongString::from(self.queue_type.as_str())),
                );
            }
        }
        if let Some(limit) = self.delivery_limit {
            arguments.insert(
                X_DELIVERY_LIMIT.into(),
                AMQPValue::LongLongInt(limit.into()),
            );
        }
        if let Some((dlx, dlq)) = &self.dead_letter {
            declare_exchange(channel, dlx, ExchangeKind::Topic).await?;
            channel
                .queue_declare(
                    short_string("dead-letter queue name", dlq)?,
                    queue_options,
                    type_only,
                )
                .await
                .map_err(Error::amqp(format!("declare dead-letter queue `{dlq}`")))?;
            channel
                .queue_bind(
                    short_string("dead-letter queue name", dlq)?,
                    short_string("dead-letter exchange name", dlx)?,
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(Error::amqp(format!(
                    "bind dead-letter queue `{dlq}` to `{dlx}` with `#`"
                )))?;
            arguments.insert(
                X_DEAD_LETTER_EXCHANGE.into(),
                AMQPValue::LongString(LongString::from(dlx.as_str())),
            );
            if self.queue_type == QueueType::Quorum
                && !self.has_argument(X_DEAD_LETTER_STRATEGY)
                && !self.has_argument(X_OVERFLOW)
            {
                // The broker's default (at-most-once) drops a dead-lettered
                // message that the dead-letter exchange routes nowhere or
                // that its queue refuses; at-least-once keeps it in this
                // queue until a dead-letter queue confirms it (RabbitMQ
                // 3.10+, and only with `reject-publish` overflow).
                arguments.insert(
                    X_DEAD_LETTER_STRATEGY.into(),
                    AMQPValue::LongString(LongString::from("at-least-once")),
                );
                arguments.insert(
                    X_OVERFLOW.into(),
                    AMQPValue::LongString(LongString::from("reject-publish")),
                );
            }
        }
        let queue = &self.queue;
        channel
            .queue_declare(short_string("queue name", queue)?, queue_options, arguments)
            .await
            .map_err(Error::amqp(format!("declare queue `{queue}`")))?;
        for (exchange, pattern) in &self.bindings {
            channel
                .queue_bind(
                    short_string("queue name", queue)?,
                    short_string("exchange name", exchange)?,
                    short_string("binding pattern", pattern)?,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(Error::amqp(format!(
                    "bind queue `{queue}` to `{exchange}` with `{pattern}`"
                )))?;
        }
        Ok(())
    }

    /// Deletes the queue, the dead-letter queue and the dead-letter exchange
    /// (with their messages), but not the exchanges of the bindings, which
    /// other queues may use. For tests and decommissioning; missing ones are
    /// not an error.
    ///
    /// # Errors
    /// [`Error::Config`] as [`validate`](Self::validate); [`Error::Amqp`]
    /// if the broker refuses.
    pub async fn delete(&self, channel: &Channel) -> Result<()> {
        self.validate()?;
        let queue = &self.queue;
        channel
            .queue_delete(
                short_string("queue name", queue)?,
                QueueDeleteOptions::default(),
            )
            .await
            .map_err(Error::amqp(format!("delete queue `{queue}`")))?;
        if let Some((dlx, dlq)) = &self.dead_letter {
            channel
                .queue_delete(
                    short_string("dead-letter queue name", dlq)?,
                    QueueDeleteOptions::default(),
                )
                .await
                .map_err(Error::amqp(format!("delete dead-letter queue `{dlq}`")))?;
            channel
                .exchange_delete(
                    short_string("dead-letter exchange name", dlx)?,
                    ExchangeDeleteOptions::default(),
                )
                .await
                .map_err(Error::amqp(format!("delete dead-letter exchange `{dlx}`")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_name_the_dead_letter_pair_after_the_queue() {
        let t = QueueTopology::new("billing")
            .exchange("shop")
            .bind("order.*");
        assert_eq!(t.queue_name(), "billing");
        assert_eq!(t.dead_letter_exchange_name(), Some("billing.dlx"));
        assert_eq!(t.dead_letter_queue_name(), Some("billing.dead"));
        assert_eq!(t.bindings().collect::<Vec<_>>(), [("shop", "order.*")]);
        assert!(t.validate().is_ok());
        let t = t.dead_letter_queue("parked").dead_letter_exchange("dlx");
        assert_eq!(t.dead_letter_exchange_name(), Some("dlx"));
        assert_eq!(t.dead_letter_queue_name(), Some("parked"));
        assert_eq!(t.without_dead_letter().dead_letter_exchange_name(), None);
    }

    #[test]
    fn invalid_settings_are_reported_before_any_declaration() {
        let no_exchange = QueueTopology::new("q").bind("order.placed");
        let err = no_exchange.validate().unwrap_err().to_string();
        assert!(
            err.contains("order.placed") && err.contains(".exchange(name)"),
            "{err}"
        );
        assert!(QueueTopology::new("").validate().is_err());
        assert!(QueueTopology::new("x".repeat(300)).validate().is_err());
        assert!(QueueTopology::new("q").bind_to("", "k").validate().is_err());
        let quorum = QueueTopology::new("q").queue_type(QueueType::Quorum);
        assert!(quorum.clone().delivery_limit(20).validate().is_ok());
        let err = quorum
            .clone()
            .delivery_limit(20)
            .without_dead_letter()
            .validate()
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        let err = err.to_string();
        assert!(
            err.contains("without a dead-letter exchange") && err.contains("drop"),
            "{err}"
        );
        let err = quorum.durable(false).validate().unwrap_err().to_string();
        assert!(err.contains("must be durable"), "{err}");
        let err = QueueTopology::new("q")
            .delivery_limit(20)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs a quorum queue"), "{err}");
        assert!(
            QueueTopology::new("q")
                .argument(&"k".repeat(300), AMQPValue::Boolean(true))
                .validate()
                .is_err()
        );
    }
}
