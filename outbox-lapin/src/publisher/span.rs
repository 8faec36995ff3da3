//! The `publish` span of each message (feature `opentelemetry`): opened
//! when a batch is handed over, closed when the message's outcome is known
//! (across narrowing rounds), and its context sent in place of the
//! recorded one. Without the feature, [`Spans`] is empty and costs nothing.

use outbox_core::{EventEnvelope, Headers, PublishOutcome};

/// The `publish` spans of one batch, by index in the batch.
pub(super) struct Spans {
    #[cfg(feature = "opentelemetry")]
    spans: Vec<Option<otel::PublishSpan>>,
}

impl Spans {
    pub(super) fn new(_len: usize) -> Self {
        Self {
            #[cfg(feature = "opentelemetry")]
            spans: std::iter::repeat_with(|| None).take(_len).collect(),
        }
    }

    /// Opens message `i`'s span, going to `exchange` with `routing_key`.
    #[cfg_attr(not(feature = "opentelemetry"), allow(clippy::unused_self))]
    pub(super) fn start(
        &mut self,
        _i: usize,
        _envelope: &EventEnvelope,
        _exchange: &str,
        _routing_key: &str,
    ) {
        #[cfg(feature = "opentelemetry")]
        if let Some(slot) = self.spans.get_mut(_i) {
            *slot = Some(otel::PublishSpan::start(_envelope, _exchange, _routing_key));
        }
    }

    /// The trace context to send with message `i` in place of the recorded
    /// one: its span's, when the span has a valid OpenTelemetry context.
    #[cfg_attr(not(feature = "opentelemetry"), allow(clippy::unused_self))]
    pub(super) fn trace(&self, _i: usize) -> Option<&Headers> {
        #[cfg(feature = "opentelemetry")]
        {
            self.spans
                .get(_i)
                .and_then(Option::as_ref)
                .and_then(otel::PublishSpan::trace)
        }
        #[cfg(not(feature = "opentelemetry"))]
        None
    }

    /// Message `i` is sent with its recorded trace context, not its span's
    /// (which would not fit). The span still ends with its outcome.
    #[cfg_attr(not(feature = "opentelemetry"), allow(clippy::unused_self))]
    pub(super) fn send_recorded(&mut self, _i: usize) {
        #[cfg(feature = "opentelemetry")]
        if let Some(span) = self.spans.get_mut(_i).and_then(Option::as_mut) {
            span.send_recorded();
        }
    }

    /// Closes message `i`'s span with its outcome.
    #[cfg_attr(not(feature = "opentelemetry"), allow(clippy::unused_self))]
    pub(super) fn end(&mut self, _i: usize, _outcome: &PublishOutcome) {
        #[cfg(feature = "opentelemetry")]
        if let Some(span) = self.spans.get_mut(_i).and_then(Option::take) {
            span.end(_outcome);
        }
    }
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use outbox_core::trace_context;
    use outbox_core::{EventEnvelope, Headers, PublishOutcome};
    use tracing::Span;

    /// One message's `publish` span and the trace context it sends.
    pub(super) struct PublishSpan {
        span: Span,
        /// `traceparent`/`tracestate` (and carried baggage) of `span`, when
        /// it has a valid OpenTelemetry context.
        trace: Option<Headers>,
        /// Whether its outcome was recorded ([`end`](Self::end)).
        ended: bool,
    }

    impl Drop for PublishSpan {
        /// Dropped without an outcome (the batch's future dropped: the
        /// relay's shutdown grace ran out): not a success, the message may
        /// or may not have been sent and is published again later.
        fn drop(&mut self) {
            if !self.ended {
                self.span.record("otel.status_code", "ERROR");
                self.span.record(
                    "otel.status_description",
                    "publish dropped before its outcome was known (the batch was cancelled)",
                );
            }
        }
    }

    impl PublishSpan {
        /// A producer span per the messaging semantic conventions, child
        /// of the context recorded with the event (so sampling follows the
        /// request's decision), linked to it and to the current span (the
        /// relay's batch span).
        pub(super) fn start(envelope: &EventEnvelope, exchange: &str, routing_key: &str) -> Self {
            // The messaging conventions name RabbitMQ's default exchange.
            let exchange = if exchange.is_empty() {
                "amq.default"
            } else {
                exchange
            };
            let span = tracing::info_span!(
                "publish",
                otel.name = %format_args!("publish {exchange}"),
                otel.kind = "producer",
                otel.status_code = tracing::field::Empty,
                otel.status_description = tracing::field::Empty,
                messaging.system = "rabbitmq",
                messaging.operation.name = "publish",
                messaging.operation.type = "send",
                messaging.destination.name = exchange,
                messaging.rabbitmq.destination.routing_key = routing_key,
                messaging.message.id = %envelope.id,
                messaging.message.conversation_id = envelope.headers.get(Headers::CORRELATION_ID),
            );
            if span.is_disabled() {
                return Self {
                    span,
                    trace: None,
                    ended: true,
                };
            }
            // Before the span's context is first read (which starts it).
            // Without a recorded context the span is the batch span's child
            // already: no link to the same span.
            if trace_context::set_parent(&span, &envelope.headers) {
                trace_context::add_link(&span, &envelope.headers);
                trace_context::link_span(&span, &Span::current());
            }
            let mut trace = Headers::new();
            let trace = trace_context::inject(&span, &mut trace).then_some(trace);
            Self {
                span,
                trace,
                ended: false,
            }
        }

        pub(super) fn trace(&self) -> Option<&Headers> {
            self.trace.as_ref()
        }

        pub(super) fn send_recorded(&mut self) {
            self.trace = None;
        }

        /// Records a failed outcome as the span's error status, and closes
        /// the span.
        pub(super) fn end(mut self, outcome: &PublishOutcome) {
            self.ended = true;
            let reason = match outcome {
                PublishOutcome::Acked => None,
                PublishOutcome::Rejected { reason }
                | PublishOutcome::Unroutable { reason }
                | PublishOutcome::Unpublishable { reason }
                | PublishOutcome::ConnectionLost { reason }
                | PublishOutcome::ConnectionDied { reason }
                | PublishOutcome::Unconfirmed { reason } => Some(reason.as_str()),
                _ => Some("failed"),
            };
            if let Some(reason) = reason {
                self.span.record("otel.status_code", "ERROR");
                self.span.record("otel.status_description", reason);
            }
        }
    }
}
