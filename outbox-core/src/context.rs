//! Headers that every event recorded in a scope inherits: correlation and
//! causation ids, trace context.
//!
//! The Axum layer scopes each request (correlation id, `traceparent`), and
//! the inbox consumer scopes each handler (causation id = the incoming event
//! id, correlation id and trace context carried over), so events recorded
//! deep in domain code carry them without plumbing. Scope your own work with
//! [`scope`]:
//!
//! ```
//! use outbox_core::{context, DomainEvent, EventEnvelope, Headers};
//! # #[derive(serde::Serialize)] struct Shipped { id: u32 }
//! # impl DomainEvent for Shipped {
//! #     fn aggregate_type(&self) -> &'static str { "order" }
//! #     fn event_type(&self) -> &'static str { "order.shipped" }
//! #     fn aggregate_id(&self) -> String { self.id.to_string() }
//! # }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let headers = Headers::new().with(Headers::CORRELATION_ID, "req-7");
//! let envelope = context::scope(headers, async {
//!     EventEnvelope::from_event(&Shipped { id: 1 })
//! })
//! .await?;
//! assert_eq!(envelope.headers.get(Headers::CORRELATION_ID), Some("req-7"));
//! # Ok::<(), outbox_core::Error>(())
//! # }).unwrap();
//! ```
//!
//! The scope is a tokio task-local: `tokio::spawn` does not inherit it. Carry
//! it into a spawned task with `context::scope(context::current(), fut)`.
//! With the `opentelemetry` feature, an event recorded inside an
//! OpenTelemetry span carries that span's trace context rather than the
//! scope's (see [`trace_context`](crate::trace_context)).

use std::future::Future;

use crate::Headers;

tokio::task_local! {
    static HEADERS: Headers;
}

/// Runs `fut` with `headers` added to the current scope's (inner values win).
pub async fn scope<F: Future>(headers: Headers, fut: F) -> F::Output {
    let mut merged = headers;
    if let Some(outer) = current_opt() {
        merged.merge_missing(&outer);
    }
    HEADERS.scope(merged, fut).await
}

/// The headers of the current scope (empty outside any scope).
pub fn current() -> Headers {
    current_opt().unwrap_or_default()
}

fn current_opt() -> Option<Headers> {
    HEADERS.try_with(Clone::clone).ok()
}

/// At record: the current OpenTelemetry span's trace context (with the
/// `opentelemetry` feature), then the current scope's headers where not
/// already set; malformed trace context and uncarried baggage dropped
/// ([`trace_context`](crate::trace_context)).
pub(crate) fn apply(headers: &mut Headers) {
    #[cfg(feature = "opentelemetry")]
    let captured = crate::trace_context::capture(headers);
    #[cfg(not(feature = "opentelemetry"))]
    let captured = false;
    // `try_with` fails only outside a scope: then there is nothing to add.
    let _ = HEADERS.try_with(|scoped| {
        if captured {
            // The span's trace context replaces the scope's whole: a
            // `tracestate` belongs with its `traceparent`.
            for (key, value) in scoped.iter() {
                if key != Headers::TRACEPARENT
                    && key != Headers::TRACESTATE
                    && headers.get(key).is_none()
                {
                    headers.insert(key, value);
                }
            }
        } else {
            headers.merge_missing(scoped);
        }
    });
    crate::trace_context::sanitize(headers);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn scopes_nest_and_inner_values_win() {
        assert!(current().is_empty());
        let outer = Headers::new()
            .with(Headers::CORRELATION_ID, "c1")
            .with(Headers::TRACEPARENT, "t1");
        let inner = Headers::new().with(Headers::CORRELATION_ID, "c2");
        let seen = scope(outer, async { scope(inner, async { current() }).await }).await;
        assert_eq!(seen.get(Headers::CORRELATION_ID), Some("c2"));
        assert_eq!(seen.get(Headers::TRACEPARENT), Some("t1"));
        assert!(current().is_empty(), "the scope ends with its future");
    }
}
