//! [`InboxConsumerBuilder`]: settings of an [`InboxConsumer`], validated at
//! [`build`](InboxConsumerBuilder::build).

use std::fmt;
use std::time::Duration;

use outbox_core::InboxDatabase;

use super::{Batching, EventHandler, InboxConsumer, Settings};
use crate::topology::short_string;
use crate::{AmqpUrls, Error, QueueTopology, Result};

/// The longest [`InboxConsumerBuilder::batch`] `max_wait`.
const MAX_BATCH_WAIT: Duration = Duration::from_secs(60);

/// Settings of an [`InboxConsumer`]; made by [`InboxConsumer::builder`].
///
/// | setting | default |
/// |---|---|
/// | [`prefetch`](Self::prefetch) | 16 |
/// | [`concurrency`](Self::concurrency) | 1 (one delivery at a time, in order) |
/// | [`max_attempts`](Self::max_attempts) | 5 |
/// | [`retry_delay`](Self::retry_delay) | 1 s |
/// | [`dead_letter_exchange`](Self::dead_letter_exchange) | the topology's, else `<queue>.dlx` |
/// | [`confirm_timeout`](Self::confirm_timeout) | 10 s |
/// | [`reconnect_backoff`](Self::reconnect_backoff) | 100 ms, doubling up to 10 s |
/// | [`declare`](Self::declare) | nothing: the queue and dead-letter exchange must exist |
/// | [`batch`](Self::batch) | off: one transaction per delivery |
/// | [`trace_links`](Self::trace_links) | off: the `process` span is a child of the producer's |
#[must_use]
pub struct InboxConsumerBuilder<D, H> {
    urls: AmqpUrls,
    queue: String,
    name: String,
    db: D,
    handler: H,
    prefetch: u16,
    concurrency: usize,
    max_attempts: u32,
    retry_delay: Duration,
    dead_letter_exchange: Option<String>,
    confirm_timeout: Duration,
    reconnect_min: Duration,
    reconnect_max: Duration,
    topology: Option<QueueTopology>,
    batch: Option<(usize, Duration)>,
    trace_links: bool,
}

impl<D, H> fmt::Debug for InboxConsumerBuilder<D, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxConsumerBuilder")
            .field("urls", &self.urls)
            .field("queue", &self.queue)
            .field("name", &self.name)
            .field("prefetch", &self.prefetch)
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .field("retry_delay", &self.retry_delay)
            .field("dead_letter_exchange", &self.dead_letter_exchange)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("topology", &self.topology)
            .field("batch", &self.batch)
            .field("trace_links", &self.trace_links)
            .finish_non_exhaustive()
    }
}

impl<D, H> InboxConsumerBuilder<D, H>
where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    pub(super) fn new(urls: AmqpUrls, queue: String, name: String, db: D, handler: H) -> Self {
        InboxConsumerBuilder {
            urls,
            queue,
            name,
            db,
            handler,
            prefetch: 16,
            concurrency: 1,
            max_attempts: 5,
            retry_delay: Duration::from_secs(1),
            dead_letter_exchange: None,
            confirm_timeout: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            topology: None,
            batch: None,
            trace_links: false,
        }
    }

    /// How many unacknowledged deliveries the broker sends ahead
    /// (`basic.qos`). Default 16; at least [`concurrency`](Self::concurrency).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n;
        self
    }

    /// How many deliveries are handled at once. Default 1: one at a time, in
    /// queue order. With `n > 1`, deliveries are spread over `n` workers by a
    /// hash of their aggregate (type and id), so the events of one aggregate
    /// are still handled one after the other, in queue order, while
    /// different aggregates proceed in parallel. Each needs its own database
    /// transaction: size the pool for `n`.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// How many times a failing message is handled before it is
    /// dead-lettered. Default 5; at least 1 (1 = never retried).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// How long a worker waits after a failure before republishing the
    /// message for its next attempt. Default 1 s.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// Where undecodable and given-up messages are republished, with their
    /// original routing key. Default: the [`declare`](Self::declare)d
    /// topology's dead-letter exchange, else `<queue>.dlx` (the
    /// [`QueueTopology`] default). It must exist when the consumer starts.
    pub fn dead_letter_exchange(mut self, name: impl Into<String>) -> Self {
        self.dead_letter_exchange = Some(name.into());
        self
    }

    /// How long a republish (retry or dead letter) waits for the broker's
    /// confirm before it counts as failed. Default 10 s.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The wait before reconnecting after a lost connection: a step of
    /// `min`, doubled after each failed attempt up to `max`, each wait adding
    /// a random part of up to half the step (never beyond `max`)
    /// ([`Backoff`](outbox_core::Backoff): consumers do not reconnect in
    /// lockstep). Default 100 ms to 10 s.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }

    /// Declares `topology` (idempotently) on every (re)connect, before
    /// consuming. Its queue must be this consumer's queue.
    pub fn declare(mut self, topology: QueueTopology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// Batch mode: each worker applies up to `max_deliveries` deliveries in
    /// **one** database transaction (the inbox entries of all of them in
    /// one [`receive_all`](InboxDatabase::receive_all) call, then one
    /// handler call per event seen for the first time, one commit), then
    /// acks them. Off by default: one
    /// transaction per delivery.
    ///
    /// **When**: the consumer must go faster than the database commits.
    /// Without batching each delivery costs one commit (a WAL flush on
    /// PostgreSQL), so a consumer tops out near the database's commit rate
    /// whatever its concurrency; a batch of `n` shares one commit among
    /// `n` events.
    ///
    /// **How a batch forms**: a worker takes the first delivery it is given
    /// (waiting as long as the queue is idle), then every delivery already
    /// waiting for it, up to `max_deliveries`; if it has fewer, it waits up
    /// to `max_wait` after the first for more. So a lone message on an
    /// idle queue is delayed by at most `max_wait`: keep it to a few
    /// milliseconds (e.g. 5 ms). `Duration::ZERO` never waits: batches
    /// then form only from a backlog, and a lone message is applied at
    /// once. A batch of one delivery takes the usual path.
    ///
    /// **What handlers see**: the same [`EventHandler`] calls, in queue
    /// order per aggregate, but several events share `tx`: a handler must
    /// not assume one transaction per event (no `COMMIT`/`ROLLBACK` of its
    /// own, no per-event `SET LOCAL`, no locks it expects released after
    /// its event). It sees what earlier events of the batch wrote.
    ///
    /// **Duplicates**: an event already in the inbox is skipped and acked
    /// as usual; the same event twice in one batch (a broker redelivery)
    /// is applied once and both deliveries are acked.
    ///
    /// **Failures cost one wasted transaction**: when anything in the
    /// batch fails (a handler error or panic, the inbox insert, the
    /// commit, beginning the transaction), the whole transaction is rolled
    /// back and the batch's deliveries are applied again one at a time,
    /// each in its own transaction: the healthy ones are applied, and the
    /// failing one gets exactly the retry, dead-letter and
    /// database-unavailable handling it would have had without batching
    /// (the failed batch spends no attempt). The handler calls made in the
    /// rolled-back transaction run again, so effects outside the
    /// transaction repeat more often than without batching. Counter
    /// [`BATCH_FAILURES_TOTAL`](super::metric_names::BATCH_FAILURES_TOTAL)
    /// counts them; a high rate means batching costs more than it saves.
    ///
    /// **Acks**: individual, after the commit. Never one `multiple` ack:
    /// it would also ack every earlier delivery tag of the channel,
    /// including deliveries other workers hold or are retrying, and a later
    /// ack of those would then be an unknown tag, which closes the channel.
    ///
    /// **Prefetch**: [`build`](Self::build) requires
    /// [`prefetch`](Self::prefetch) ≥ `max_deliveries` ×
    /// [`concurrency`](Self::concurrency), else batches could never fill.
    /// Twice that keeps the next batch arriving while one commits.
    ///
    /// **Shutdown**: a batch open when shutdown begins is rolled back
    /// before its next event (so shutdown waits for at most one handler
    /// call, not a whole batch) and its deliveries are returned to the
    /// queue, unacked: nothing is lost. Dropping the [`run`](InboxConsumer::run)
    /// future mid-batch drops the transaction (rolled back) and the
    /// broker redelivers the unacked messages.
    ///
    /// Its transaction stays open for the whole batch: keep
    /// `max_deliveries` × the handler's time well under the database's
    /// `idle_in_transaction_session_timeout` and lock timeouts. Size the
    /// pool as without batching: one connection per worker.
    ///
    /// `max_wait` is at most 60 s ([`build`](Self::build) refuses more).
    pub fn batch(mut self, max_deliveries: usize, max_wait: Duration) -> Self {
        self.batch = Some((max_deliveries, max_wait));
        self
    }

    /// Whether each event's `process` span starts a new trace *linked* to
    /// the producer's context the message carries (`true`), instead of
    /// continuing that trace as its child (`false`, the default).
    ///
    /// A child keeps one business flow (an order, say) in one trace and
    /// follows the producer's sampling decision; a link suits consumers
    /// whose work is not part of the producer's request (a nightly import
    /// fed by many producers, a fan-out to many services that would make
    /// one trace huge). In [batch mode](Self::batch) a linked `process`
    /// span is a child of its batch's span. Either way the span carries the
    /// incoming trace id in its `trace_id` field, for log lines.
    ///
    /// Only with the `opentelemetry` feature (and a `tracing-opentelemetry`
    /// layer installed); without the feature this setting does nothing.
    pub fn trace_links(mut self, link: bool) -> Self {
        self.trace_links = link;
        self
    }

    /// Checks the settings and builds the consumer. Nothing connects yet.
    ///
    /// # Errors
    /// [`Error::NoUrls`] for an empty URL list; [`Error::Config`] saying
    /// which setting is invalid.
    pub fn build(self) -> Result<InboxConsumer<D, H>> {
        self.urls.check()?;
        let config = |message: String| Err(Error::Config(message));
        if self.queue.is_empty() {
            return config("the queue name is empty".into());
        }
        if self.name.is_empty() {
            return config(
                "the consumer name is empty; it keys the inbox, so pick a stable name per \
                 consuming service"
                    .into(),
            );
        }
        short_string("queue name", &self.queue)?;
        short_string("consumer name", &self.name)?;
        if self.prefetch == 0 {
            return config("prefetch must be at least 1 (0 would mean unlimited)".into());
        }
        if self.concurrency == 0 {
            return config("concurrency must be at least 1".into());
        }
        if self.concurrency > usize::from(self.prefetch) {
            return config(format!(
                "concurrency ({}) exceeds prefetch ({}): workers would sit idle; raise prefetch",
                self.concurrency, self.prefetch
            ));
        }
        if self.max_attempts == 0 {
            return config("max_attempts must be at least 1".into());
        }
        if self.confirm_timeout.is_zero() {
            return config("confirm_timeout must be positive".into());
        }
        if self.reconnect_min.is_zero() || self.reconnect_max < self.reconnect_min {
            return config(
                "reconnect_backoff needs 0 < min <= max (a zero wait would be a hot loop)".into(),
            );
        }
        let batch = match self.batch {
            None => None,
            Some((0, _)) => {
                return config("batch: max_deliveries must be at least 1".into());
            }
            Some((_, max_wait)) if max_wait > MAX_BATCH_WAIT => {
                return config(format!(
                    "batch: max_wait ({max_wait:?}) is above {MAX_BATCH_WAIT:?}: a lone message \
                     on a quiet queue waits that long; a few milliseconds is enough to fill \
                     batches under load"
                ));
            }
            Some((max_deliveries, max_wait)) => {
                let needed = max_deliveries.saturating_mul(self.concurrency);
                if usize::from(self.prefetch) < needed {
                    return config(format!(
                        "batch: prefetch ({}) is below max_deliveries ({max_deliveries}) x \
                         concurrency ({}) = {needed}, so batches could never fill; raise \
                         prefetch to at least {needed} (twice that keeps the next batch \
                         arriving while one commits); prefetch is at most {}",
                        self.prefetch,
                        self.concurrency,
                        u16::MAX
                    ));
                }
                Some(Batching {
                    max_deliveries,
                    max_wait,
                })
            }
        };
        if let Some(topology) = &self.topology {
            topology.validate()?;
            if topology.queue_name() != self.queue {
                return config(format!(
                    "the declared topology is for queue `{}`, the consumer reads `{}`",
                    topology.queue_name(),
                    self.queue
                ));
            }
        }
        let dead_letter_exchange = match (&self.dead_letter_exchange, &self.topology) {
            (Some(name), _) => name.clone(),
            (None, Some(topology)) => match topology.dead_letter_exchange_name() {
                Some(name) => name.to_owned(),
                None => {
                    return config(
                        "the declared topology has no dead-letter exchange: set one with \
                         `.dead_letter_exchange(name)`"
                            .into(),
                    );
                }
            },
            (None, None) => format!("{}.dlx", self.queue),
        };
        if dead_letter_exchange.is_empty() {
            return config(
                "the dead-letter exchange name is empty (the default exchange would route \
                 dead messages by queue name)"
                    .into(),
            );
        }
        short_string("dead-letter exchange name", &dead_letter_exchange)?;
        // Its depth is exported only when the dead letters go where the
        // declared topology's dead-letter queue collects them.
        let dead_letter_queue = self.topology.as_ref().and_then(|topology| {
            (topology.dead_letter_exchange_name() == Some(dead_letter_exchange.as_str()))
                .then(|| topology.dead_letter_queue_name().map(str::to_owned))
                .flatten()
        });
        Ok(InboxConsumer {
            settings: Settings {
                urls: self.urls,
                queue: self.queue,
                name: self.name,
                prefetch: self.prefetch,
                concurrency: self.concurrency,
                max_attempts: self.max_attempts,
                retry_delay: self.retry_delay,
                dead_letter_exchange,
                dead_letter_queue,
                confirm_timeout: self.confirm_timeout,
                reconnect_min: self.reconnect_min,
                reconnect_max: self.reconnect_max,
                topology: self.topology,
                batch,
                trace_links: self.trace_links,
            },
            db: self.db,
            handler: self.handler,
        })
    }
}
