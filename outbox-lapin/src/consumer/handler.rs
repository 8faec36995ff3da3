//! What the consumer runs per event: [`EventHandler`], its error
//! [`HandlerError`], and [`handler_fn`] for closures.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::IncomingEvent;

/// The boxed future a [`handler_fn`] closure returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// Applies one incoming event, inside the consumer's database transaction.
///
/// The [`InboxConsumer`](crate::InboxConsumer) calls
/// [`handle`](Self::handle) only for an event this consumer has not
/// processed before, with `tx` already holding the inbox entry. Do every
/// database effect on `tx`: the consumer commits it after `handle` returns
/// `Ok` and only then acknowledges the message; on `Err` (or a panic) it
/// rolls back — the inbox entry included — and retries the message later.
/// Effects outside `tx` (HTTP calls, emails) are not rolled back and may run
/// more than once: make them idempotent, or record an outbox event on `tx`
/// instead and let the relay deliver it.
///
/// In [batch mode](crate::InboxConsumerBuilder::batch) several events share
/// `tx` (one call each, in queue order per aggregate, one commit): do not
/// assume one transaction per event, and expect a call to be repeated when
/// another event of its batch fails (the batch is rolled back and applied
/// again one event at a time).
///
/// Events recorded on `tx` inherit `causation_id` = this event's id and its
/// `correlation_id`, `traceparent` and `tracestate` (through
/// [`outbox_core::context`]).
///
/// Implement it on your own type (an `async fn` works):
///
/// ```
/// use outbox_core::testing::InboxTx;
/// use outbox_lapin::{EventHandler, HandlerError, IncomingEvent};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced { total_cents: i64 }
///
/// struct Loyalty;
///
/// impl EventHandler<InboxTx> for Loyalty {
///     async fn handle(&self, _tx: &mut InboxTx, event: &IncomingEvent) -> Result<(), HandlerError> {
///         // A payload that cannot match will never succeed: dead-letter it now.
///         let order: OrderPlaced = event.payload_as().map_err(HandlerError::permanent)?;
///         if order.total_cents < 0 {
///             return Err(HandlerError::permanent("negative total"));
///         }
///         // ... award points on the transaction ...
///         Ok(())
///     }
/// }
/// ```
pub trait EventHandler<Tx>: Send + Sync + 'static {
    /// Applies `event` on `tx`. `Err` rolls `tx` back; the message is then
    /// retried, or dead-lettered after the last attempt or at once for a
    /// [permanent](HandlerError::permanent) error.
    fn handle(
        &self,
        tx: &mut Tx,
        event: &IncomingEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

impl<Tx, H: EventHandler<Tx>> EventHandler<Tx> for Arc<H> {
    fn handle(
        &self,
        tx: &mut Tx,
        event: &IncomingEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        (**self).handle(tx, event)
    }
}

/// An [`EventHandler`] made from a closure with [`handler_fn`].
#[derive(Clone)]
pub struct HandlerFn<F> {
    f: F,
}

impl<F> fmt::Debug for HandlerFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerFn")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

/// Makes an [`EventHandler`] from a closure that returns a boxed future
/// borrowing the transaction and the event (`Box::pin(async move { … })`).
///
/// The box is what lets a closure's future borrow its arguments on stable
/// Rust; for a handler with state, implementing [`EventHandler`] on your own
/// type avoids it.
///
/// ```
/// use outbox_core::testing::InboxTx;
/// use outbox_lapin::{handler_fn, HandlerError, IncomingEvent};
///
/// let handler = handler_fn(|_tx: &mut InboxTx, event: &IncomingEvent| {
///     Box::pin(async move {
///         tracing::info!(id = %event.id, "got {}", event.event_type);
///         Ok::<(), HandlerError>(())
///     })
/// });
/// # let _ = handler;
/// ```
pub fn handler_fn<Tx, F>(f: F) -> HandlerFn<F>
where
    F: for<'a> Fn(&'a mut Tx, &'a IncomingEvent) -> HandlerFuture<'a> + Send + Sync + 'static,
{
    HandlerFn { f }
}

impl<Tx: Send, F> EventHandler<Tx> for HandlerFn<F>
where
    F: for<'a> Fn(&'a mut Tx, &'a IncomingEvent) -> HandlerFuture<'a> + Send + Sync + 'static,
{
    // An `async fn` (not the boxed future itself): the closure's one
    // lifetime `'a` is the shorter of the two borrows, which only an async
    // body can name in the returned type.
    async fn handle(&self, tx: &mut Tx, event: &IncomingEvent) -> Result<(), HandlerError> {
        (self.f)(tx, event).await
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a handler failed: any error, plus whether retrying can help.
///
/// `?` converts every `std::error::Error + Send + Sync + 'static` (a diesel
/// error, a serde error, …) into a retryable `HandlerError`; build one from
/// a message with [`HandlerError::new`]. Errors that no retry can fix (a
/// payload that does not parse, a business rule that rejects the event) are
/// [`permanent`](Self::permanent): the message goes to the dead-letter
/// exchange at once instead of after the last attempt.
///
/// Its text (the error and its sources, joined by `: `) travels with the
/// message in the `x-outbox-last-error` and `x-outbox-dead-reason` headers.
///
/// Like `anyhow::Error`, it does not implement `std::error::Error` itself
/// (that is what makes the blanket `From` possible); [`as_error`](Self::as_error)
/// gives the wrapped error.
pub struct HandlerError {
    error: BoxError,
    permanent: bool,
}

impl HandlerError {
    /// A retryable failure: `error` is an error or a message (`&str`, `String`).
    pub fn new(error: impl Into<BoxError>) -> Self {
        HandlerError {
            error: error.into(),
            permanent: false,
        }
    }

    /// A failure no retry can fix: the message is dead-lettered at once.
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        HandlerError {
            error: error.into(),
            permanent: true,
        }
    }

    /// `true` for a [`permanent`](Self::permanent) failure.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The wrapped error.
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The wrapped error, owned.
    pub fn into_inner(self) -> BoxError {
        self.error
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        HandlerError::new(error)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        let mut source = self.error.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("error", &self.error)
            .field("permanent", &self.permanent)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    fn fails() -> Result<(), HandlerError> {
        Err(Outer(std::io::Error::other("inner")))?;
        Ok(())
    }

    #[test]
    fn question_mark_converts_errors_and_display_shows_the_chain() {
        let err = fails().unwrap_err();
        assert_eq!(err.to_string(), "outer: inner");
        assert!(!err.is_permanent());
        assert!(err.as_error().downcast_ref::<Outer>().is_some());
        let permanent = HandlerError::permanent("bad payload");
        assert!(permanent.is_permanent());
        assert_eq!(permanent.to_string(), "bad payload");
    }
}
