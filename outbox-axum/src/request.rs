//! One request's scope: its collector and transaction slot, and what the
//! layer does with them once the handler is done.

use std::sync::Arc;

use axum::response::Response;
use http::{Extensions, StatusCode};
use outbox_core::Headers;

use crate::Events;
use crate::error::{json_error, unavailable};
use crate::layer::Config;
use crate::tx::{Held, TxCell};

/// The per-request state. Dropped before [`finish`](Self::finish) completes
/// (a cancelled request, a panic, an inner service error), it closes the
/// collector and discards an open transaction's connection, so PostgreSQL
/// rolls back.
pub(crate) struct RequestScope {
    config: Arc<Config>,
    events: Events,
    tx: TxCell,
}

impl RequestScope {
    pub(crate) fn new(config: Arc<Config>, headers: Headers) -> Self {
        RequestScope {
            events: Events::new(config.outbox.clone(), headers),
            tx: TxCell::new(Arc::clone(&config)),
            config,
        }
    }

    /// Makes the extractors find this scope.
    pub(crate) fn install(&self, extensions: &mut Extensions) {
        extensions.insert(self.events.clone());
        extensions.insert(self.tx.clone());
    }

    pub(crate) fn events(&self) -> &Events {
        &self.events
    }

    /// After the handler returned `response`: commit (writing the staged
    /// events first) or roll back, and answer.
    pub(crate) async fn finish(self, response: Response) -> Response {
        let status = response.status();
        let (staged, flushed) = self.events.finish();
        let commit = (self.config.commit_if)(status);
        let held = match self.tx.take() {
            Ok(held) => held,
            Err(_still_borrowed) => {
                tracing::error!(
                    %status,
                    "a `Tx` was still alive after the handler returned (moved into a spawned \
                     task or the response?): its transaction is rolled back when it is dropped"
                );
                return if commit { internal_error() } else { response };
            }
        };

        if !commit {
            if let Some(held) = held {
                held.rollback().await;
            }
            if !staged.is_empty() {
                tracing::debug!(
                    %status,
                    dropped = staged.len(),
                    "not a success response: rolled back, staged events dropped"
                );
            }
            return response;
        }

        let written = match held {
            Some(held) => {
                if let Err(error) = held.commit(self.config.outbox.as_deref(), &staged).await {
                    tracing::error!(
                        %error,
                        %status,
                        events = staged.len(),
                        "writing the outbox or committing the request's transaction failed; \
                         answering 500 instead, nothing of the request is stored (\"current \
                         transaction is aborted\": a statement of the handler failed and the \
                         handler still answered success)"
                    );
                    return json_error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the request's transaction could not be committed",
                    );
                }
                staged.len()
            }
            None if staged.is_empty() => 0,
            None if self.config.standalone => {
                let held = match Held::begin(&self.config).await {
                    Ok(held) => held,
                    Err(rejection) => {
                        tracing::error!(
                            error = %rejection,
                            events = staged.len(),
                            "no transaction for the request's standalone events; answering 503"
                        );
                        return unavailable(self.config.retry_after);
                    }
                };
                if let Err(error) = held.commit(self.config.outbox.as_deref(), &staged).await {
                    tracing::error!(
                        %error,
                        events = staged.len(),
                        "writing the request's standalone events failed; answering 500"
                    );
                    return json_error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the request's events could not be recorded",
                    );
                }
                staged.len()
            }
            None => {
                tracing::error!(
                    %status,
                    events = staged.len(),
                    event_types = ?staged.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>(),
                    "events were raised but never written: the handler neither used `Tx` nor \
                     called `Events::flush` in its own transaction; answering 500 (use `Tx`, \
                     `flush`, `Events::clear`, or `OutboxLayer::standalone(true)`)"
                );
                return internal_error();
            }
        };

        if written + flushed > 0
            && let Some(relay) = &self.config.relay
        {
            relay.notify();
        }
        response
    }
}

impl Drop for RequestScope {
    fn drop(&mut self) {
        // A no-op after `finish`; otherwise the request ended early.
        let (staged, _) = self.events.finish();
        if let Ok(Some(held)) = self.tx.take() {
            tracing::debug!(
                dropped = staged.len(),
                "request ended before its response (cancelled, panicked or failed): \
                 transaction rolled back"
            );
            drop(held); // closes the connection: PostgreSQL rolls back
        }
    }
}

fn internal_error() -> Response {
    json_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error: the request's changes were rolled back",
    )
}
