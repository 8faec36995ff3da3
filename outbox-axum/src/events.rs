//! The request's event collector: [`Events`] and [`raise`].

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::FromRequestParts;
use std::any::Any;

use http::request::Parts;
use outbox_core::{DomainEvent, EventEnvelope, Headers, trace_context};
use outbox_diesel::{AsConnection, Connection};
use uuid::Uuid;

use crate::{Error, MissingLayer, Result};

tokio::task_local! {
    static CURRENT: Events;
}

/// The request's event collector: events raised here are staged and written
/// into the outbox in the request's transaction, just before it commits.
///
/// Get it as an extractor, or anywhere below the handler with
/// [`Events::current`] (and raise directly with [`raise`](crate::raise)).
/// It is a cheap, cloneable handle to one collector per request.
///
/// [`raise`](Self::raise) builds the envelope at once (id, time, payload,
/// headers), so a payload that fails to serialize is an error in the
/// handler, not at commit. Events of a request that ends without a success
/// response, or that panics, are dropped with its transaction.
///
/// The collector is in a tokio task-local scope around the handler:
/// `tokio::spawn` does not inherit it. Carry it into a spawned task with
/// [`scope`](Self::scope) (which also carries the correlation and trace
/// headers), and await the task before the handler returns; an event raised
/// after the request is finished is an error ([`Error::RequestFinished`]),
/// never silently dropped:
///
/// ```no_run
/// use outbox_axum::Events;
/// # #[derive(serde::Serialize)] struct Ping { id: u32 }
/// # impl outbox_core::DomainEvent for Ping {
/// #     fn aggregate_type(&self) -> &'static str { "ping" }
/// #     fn event_type(&self) -> &'static str { "ping.sent" }
/// #     fn aggregate_id(&self) -> String { self.id.to_string() }
/// # }
///
/// # async fn handler() -> Result<(), Box<dyn std::error::Error>> {
/// let events = Events::current().ok_or(outbox_axum::Error::NoRequestScope)?;
/// let task = tokio::spawn(events.scope(async {
///     outbox_axum::raise(Ping { id: 1 }) // same collector, same headers
/// }));
/// task.await??;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Events {
    shared: Arc<Shared>,
}

struct Shared {
    /// The layer's recorder; `None`: the connection's default one.
    outbox: Option<Arc<dyn Any + Send + Sync>>,
    headers: Headers,
    state: Mutex<Collector>,
}

#[derive(Default)]
struct Collector {
    staged: Vec<EventEnvelope>,
    /// Events written by [`Events::flush`] into the caller's transaction.
    flushed: usize,
    finished: bool,
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Events")
            .field("headers", &self.shared.headers)
            .field("staged", &state.staged.len())
            .field("flushed", &state.flushed)
            .field("finished", &state.finished)
            .finish()
    }
}

impl Events {
    /// A collector for one request, writing to `outbox`, whose events get
    /// `headers` where they do not set their own.
    pub(crate) fn new(outbox: Option<Arc<dyn Any + Send + Sync>>, headers: Headers) -> Self {
        Events {
            shared: Arc::new(Shared {
                outbox,
                headers,
                state: Mutex::new(Collector::default()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Collector> {
        // Never held across a panic-prone call: poisoning cannot leave the
        // collector half-updated, so the data is still good.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The collector of the current request, if this code runs inside one
    /// (in the handler's task, or in a future wrapped in [`scope`](Self::scope)).
    pub fn current() -> Option<Events> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Stages `event` (by value or by reference: `&E` is a `DomainEvent`
    /// too): builds its envelope now (a new UUID v7 id, the
    /// serialized payload, the request's correlation id and trace context)
    /// and writes it with the request's transaction.
    ///
    /// # Errors
    /// [`Error::Event`] if the payload fails to serialize or the event is
    /// invalid (nothing is staged); [`Error::RequestFinished`] if the
    /// request's transaction is already finished.
    pub fn raise<E: DomainEvent>(&self, event: E) -> Result<()> {
        self.raise_envelope(EventEnvelope::from_event(&event)?)
    }

    /// Stages a prepared envelope (e.g. with headers of its own). The
    /// request's headers are added where the envelope has none (its trace
    /// context only if the envelope carries none: a `tracestate` belongs
    /// with its `traceparent`); a malformed trace context is dropped with a
    /// warning ([`trace_context::sanitize`]).
    ///
    /// # Errors
    /// As [`raise`](Self::raise).
    pub fn raise_envelope(&self, mut envelope: EventEnvelope) -> Result<()> {
        let own_trace = envelope.headers.get(Headers::TRACEPARENT).is_some();
        for (key, value) in self.shared.headers.iter() {
            let trace = key == Headers::TRACEPARENT || key == Headers::TRACESTATE;
            if !(own_trace && trace) && envelope.headers.get(key).is_none() {
                envelope.headers.insert(key, value);
            }
        }
        trace_context::sanitize(&mut envelope.headers);
        envelope.validate()?;
        let mut state = self.lock();
        if state.finished {
            return Err(Error::RequestFinished);
        }
        state.staged.push(envelope);
        Ok(())
    }

    /// Writes the staged events into the transaction open on `conn` (one
    /// `INSERT`) and unstages them; returns how many were written.
    ///
    /// For handlers that run their own transaction instead of using
    /// [`Tx`](crate::Tx): call it inside that transaction, before it commits.
    /// The events are then stored if and only if that transaction commits.
    /// If it fails, the events stay staged (and the request fails unless
    /// they are written some other way).
    ///
    /// # Errors
    /// [`Error::Store`] if no transaction is open on `conn`
    /// (`outbox_diesel::Error::NoTransaction`) or the insert fails;
    /// [`Error::RequestFinished`] after the request is finished.
    pub async fn flush<A: AsConnection>(&self, conn: &mut A) -> Result<usize> {
        let envelopes = {
            let state = self.lock();
            if state.finished {
                return Err(Error::RequestFinished);
            }
            state.staged.clone()
        };
        // Unstaged only once written: a failed or cancelled flush keeps them.
        let conn = conn.as_connection();
        let default = <A::Conn as Connection>::Recorder::default();
        let recorder = match &self.shared.outbox {
            None => &default,
            Some(any) => any
                .downcast_ref::<<A::Conn as Connection>::Recorder>()
                .ok_or_else(|| {
                    outbox_diesel::Error::Config(format!(
                        "the layer's outbox (OutboxLayer::outbox) is not the recorder of this \
                     connection type ({}): give it a {}",
                        std::any::type_name::<A::Conn>(),
                        std::any::type_name::<<A::Conn as Connection>::Recorder>(),
                    ))
                })?,
        };
        <A::Conn as Connection>::record_envelopes(recorder, conn, &envelopes).await?;
        let written: HashSet<Uuid> = envelopes.iter().map(|e| e.id).collect();
        let mut state = self.lock();
        let before = state.staged.len();
        state.staged.retain(|e| !written.contains(&e.id));
        let n = before - state.staged.len();
        state.flushed += n;
        Ok(n)
    }

    /// Number of staged events (raised, not yet written).
    pub fn len(&self) -> usize {
        self.lock().staged.len()
    }

    /// `true` when no event is staged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the staged events on purpose, returning how many there were:
    /// the way to send a success response without them.
    pub fn clear(&self) -> usize {
        std::mem::take(&mut self.lock().staged).len()
    }

    /// The headers every event of this request gets: the correlation id and,
    /// when the request carried them, `traceparent` and `tracestate`.
    pub fn headers(&self) -> &Headers {
        &self.shared.headers
    }

    /// The request's correlation id (from its `x-request-id` or
    /// `x-correlation-id` header, or a generated UUID v7).
    pub fn correlation_id(&self) -> Option<&str> {
        self.shared.headers.get(Headers::CORRELATION_ID)
    }

    /// Runs `future` with this collector as the current one (for
    /// [`raise`](crate::raise) and [`Events::current`]) and the request's
    /// headers in [`outbox_core::context`], e.g. in a task spawned by the
    /// handler. The layer runs every handler this way.
    pub fn scope<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        CURRENT.scope(
            self.clone(),
            outbox_core::context::scope(self.shared.headers.clone(), future),
        )
    }

    /// Closes the collector; returns the staged events and how many were
    /// flushed. Later raises fail with [`Error::RequestFinished`].
    pub(crate) fn finish(&self) -> (Vec<EventEnvelope>, usize) {
        let mut state = self.lock();
        state.finished = true;
        (std::mem::take(&mut state.staged), state.flushed)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Events {
    type Rejection = MissingLayer;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Events>()
            .cloned()
            .ok_or(MissingLayer)
    }
}

/// Stages `event` in the current request's collector, from anywhere in the
/// handler's call stack: domain code need not take an [`Events`] parameter.
///
/// ```
/// # #[derive(serde::Serialize)] struct Shipped { id: u32 }
/// # impl outbox_core::DomainEvent for Shipped {
/// #     fn aggregate_type(&self) -> &'static str { "order" }
/// #     fn event_type(&self) -> &'static str { "order.shipped" }
/// #     fn aggregate_id(&self) -> String { self.id.to_string() }
/// # }
/// fn ship(order_id: u32) -> Result<(), outbox_axum::Error> {
///     // ... domain logic ...
///     outbox_axum::raise(Shipped { id: order_id })
/// }
///
/// // Outside a request handled by `OutboxLayer` there is nowhere to stage it:
/// assert!(matches!(ship(1), Err(outbox_axum::Error::NoRequestScope)));
/// ```
///
/// # Errors
/// [`Error::NoRequestScope`] outside a request scope (see
/// [`Events::scope`] for spawned tasks), otherwise as [`Events::raise`].
pub fn raise<E: DomainEvent>(event: E) -> Result<()> {
    CURRENT
        .try_with(|events| events.raise(event))
        .map_err(|_| Error::NoRequestScope)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::collections::HashMap;

    #[derive(Serialize)]
    struct Noted<T: Serialize> {
        id: String,
        body: T,
    }

    impl<T: Serialize> DomainEvent for Noted<T> {
        fn aggregate_type(&self) -> &'static str {
            "note"
        }
        fn event_type(&self) -> &'static str {
            "note.taken"
        }
        fn aggregate_id(&self) -> String {
            self.id.clone()
        }
    }

    fn note(id: &str) -> Noted<()> {
        Noted {
            id: id.into(),
            body: (),
        }
    }

    const REQUEST_TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn events() -> Events {
        Events::new(
            None,
            Headers::new()
                .with(Headers::CORRELATION_ID, "req-1")
                .with(Headers::TRACEPARENT, REQUEST_TP)
                .with(Headers::TRACESTATE, "congo=t61rcWkgMzE"),
        )
    }

    #[tokio::test]
    async fn raise_stages_envelopes_with_the_request_headers() {
        let events = events();
        events.raise(note("a")).unwrap();
        let own = EventEnvelope::from_event(&note("b"))
            .unwrap()
            .with_correlation_id("mine");
        events.raise_envelope(own).unwrap();
        assert_eq!(events.len(), 2);
        let (staged, flushed) = events.finish();
        assert_eq!(flushed, 0);
        assert_eq!(staged[0].aggregate_id, "a");
        assert_eq!(
            staged[0].headers.get(Headers::CORRELATION_ID),
            Some("req-1")
        );
        assert_eq!(
            staged[0].headers.get(Headers::TRACEPARENT),
            Some(REQUEST_TP)
        );
        assert_eq!(staged[1].headers.get(Headers::CORRELATION_ID), Some("mine"));
        assert_eq!(
            staged[1].headers.get(Headers::TRACEPARENT),
            Some(REQUEST_TP)
        );
        assert_eq!(
            staged[1].headers.get(Headers::TRACESTATE),
            Some("congo=t61rcWkgMzE")
        );
    }

    #[tokio::test]
    async fn an_envelope_s_own_trace_context_is_not_mixed_with_the_request_s_and_malformed_ones_are_dropped()
     {
        let events = events();
        let own_tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let own = EventEnvelope::from_event(&note("a"))
            .unwrap()
            .with_traceparent(own_tp);
        events.raise_envelope(own).unwrap();
        let malformed = EventEnvelope::from_event(&note("b"))
            .unwrap()
            .with_traceparent("garbage");
        events.raise_envelope(malformed).unwrap();
        let (staged, _) = events.finish();
        assert_eq!(staged[0].headers.get(Headers::TRACEPARENT), Some(own_tp));
        assert_eq!(
            staged[0].headers.get(Headers::TRACESTATE),
            None,
            "the request's tracestate belongs to the request's traceparent"
        );
        assert_eq!(
            staged[1].headers.get(Headers::TRACEPARENT),
            None,
            "dropped, not stored"
        );
        assert_eq!(
            staged[1].headers.get(Headers::CORRELATION_ID),
            Some("req-1")
        );
    }

    #[tokio::test]
    async fn serialization_errors_surface_at_raise_and_stage_nothing() {
        let events = events();
        let mut body = HashMap::new();
        body.insert((1, 2), "tuple keys are not JSON object keys");
        let err = events
            .raise(&Noted {
                id: "x".into(),
                body,
            })
            .unwrap_err();
        assert!(
            matches!(err, Error::Event(outbox_core::Error::Serialize { .. })),
            "{err:?}"
        );
        assert!(events.is_empty());
    }

    #[tokio::test]
    async fn the_task_local_reaches_nested_code_and_scoped_spawns_only() {
        assert!(matches!(raise(note("x")), Err(Error::NoRequestScope)));
        let events = events();
        events
            .scope(async {
                fn deep() -> Result<()> {
                    raise(note("deep"))
                }
                deep().unwrap();
                let unscoped = tokio::spawn(async { raise(note("lost")) });
                assert!(matches!(
                    unscoped.await.unwrap(),
                    Err(Error::NoRequestScope)
                ));
                let carried = Events::current().unwrap();
                tokio::spawn(carried.scope(async {
                    let envelope = EventEnvelope::from_event(&note("spawned")).unwrap();
                    assert_eq!(
                        envelope.headers.get(Headers::CORRELATION_ID),
                        Some("req-1"),
                        "context headers travel with the scope"
                    );
                    raise(note("spawned"))
                }))
                .await
                .unwrap()
                .unwrap();
            })
            .await;
        let ids: Vec<String> = events
            .finish()
            .0
            .into_iter()
            .map(|e| e.aggregate_id)
            .collect();
        assert_eq!(ids, ["deep", "spawned"]);
    }

    #[tokio::test]
    async fn raising_after_the_request_finished_is_an_error() {
        let events = events();
        events.raise(note("a")).unwrap();
        let (staged, _) = events.finish();
        assert_eq!(staged.len(), 1);
        assert!(matches!(
            events.raise(note("late")),
            Err(Error::RequestFinished)
        ));
        assert_eq!(events.clear(), 0);
    }
}
