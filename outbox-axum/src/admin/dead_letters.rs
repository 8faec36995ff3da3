//! `/dead-letters`: consumers' dead letters over
//! [`DeadLetters`], behind the router's authentication.
//!
//! The router holds them as a trait object, so that its type does not grow
//! a parameter per store and broker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use outbox_core::admin::{
    AdminError, Caller, DeadLetterBroker, DeadLetterGroup, DeadLetterQuery, DeadLetterRecord,
    DeadLetterStore, DeadLetters, DlqPurge, DlqPurgeOutcome, DlqReplay, DlqReplayOutcome,
    OutboxAdmin, Page, StopCause,
};
use serde::Deserialize;

use super::error::ApiError;
use super::handlers::{AppState, Authenticated, Body, Shared, detached_with, operator};
use super::query::DEFAULT_LIMIT;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, AdminError>> + Send + 'a>>;

/// [`DeadLetters`] with its store and broker types erased.
pub(crate) trait DeadLetterVerbs: Send + Sync + 'static {
    fn list<'a>(&'a self, query: &'a DeadLetterQuery) -> Boxed<'a, Page<DeadLetterRecord>>;
    fn show(&self, id: i64) -> Boxed<'_, DeadLetterRecord>;
    fn groups<'a>(&'a self, queue: Option<&'a str>) -> Boxed<'a, Vec<DeadLetterGroup>>;
    fn replay<'a>(
        &'a self,
        caller: &'a Caller,
        request: &'a DlqReplay,
    ) -> Boxed<'a, DlqReplayOutcome>;
    fn purge<'a>(&'a self, caller: &'a Caller, request: &'a DlqPurge)
    -> Boxed<'a, DlqPurgeOutcome>;
}

impl<S: DeadLetterStore, B: DeadLetterBroker> DeadLetterVerbs for DeadLetters<S, B> {
    fn list<'a>(&'a self, query: &'a DeadLetterQuery) -> Boxed<'a, Page<DeadLetterRecord>> {
        Box::pin(DeadLetters::list(self, query))
    }

    fn show(&self, id: i64) -> Boxed<'_, DeadLetterRecord> {
        Box::pin(DeadLetters::show(self, id))
    }

    fn groups<'a>(&'a self, queue: Option<&'a str>) -> Boxed<'a, Vec<DeadLetterGroup>> {
        Box::pin(DeadLetters::groups(self, queue))
    }

    fn replay<'a>(
        &'a self,
        caller: &'a Caller,
        request: &'a DlqReplay,
    ) -> Boxed<'a, DlqReplayOutcome> {
        Box::pin(DeadLetters::replay(self, caller, request, &|_| {}))
    }

    fn purge<'a>(
        &'a self,
        caller: &'a Caller,
        request: &'a DlqPurge,
    ) -> Boxed<'a, DlqPurgeOutcome> {
        Box::pin(DeadLetters::purge(self, caller, request))
    }
}

/// The dead-letter verbs, or `404` saying how to get them.
fn verbs<S>(app: &Shared<S>) -> Result<Arc<dyn DeadLetterVerbs>, ApiError> {
    app.dead_letters.clone().ok_or_else(|| {
        ApiError::Request(
            StatusCode::NOT_FOUND,
            "dead letters are not served here: build the admin router with \
             `.dead_letters(DeadLetters::new(store, broker))`"
                .into(),
        )
    })
}

/// The most records `GET /dead-letters` answers at once (each may hold a
/// 64 KiB payload).
const MAX_LIST: usize = 1_000;

/// `GET /dead-letters` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    queue: Option<String>,
    after: Option<i64>,
    limit: Option<usize>,
    #[serde(default)]
    all: bool,
}

pub(crate) async fn list<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Page<DeadLetterRecord>>, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::invalid(format!(
            "invalid query string: {}; known parameters: queue, after, limit, all",
            e.body_text()
        ))
    })?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_LIST}, not {limit}"
        )));
    }
    let mut query = DeadLetterQuery::new()
        .after(q.after)
        .limit(limit)
        .include_settled(q.all)
        .payloads(app.allow_payloads);
    if let Some(queue) = q.queue {
        query = query.queue(queue);
    }
    Ok(Json(verbs(&app)?.list(&query).await?))
}

pub(crate) async fn show<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<DeadLetterRecord>, ApiError> {
    let Path(id) = id?;
    let record = verbs(&app)?.show(id).await?;
    Ok(Json(if app.allow_payloads {
        record
    } else {
        record.redacted()
    }))
}

/// `GET /dead-letter-groups` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupsQuery {
    queue: Option<String>,
}

pub(crate) async fn groups<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
    query: Result<Query<GroupsQuery>, QueryRejection>,
) -> Result<Json<Vec<DeadLetterGroup>>, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::invalid(format!(
            "invalid query string: {}; known parameter: queue",
            e.body_text()
        ))
    })?;
    Ok(Json(verbs(&app)?.groups(q.queue.as_deref()).await?))
}

/// A replay's answer, the outcome as the body: `200`; `409` when it
/// stopped on a message that cannot go back; `503` when the broker or the
/// store failed part way (their text, which may name hosts and users, is
/// logged and replaced). What moved before a stop is done and counted.
pub(crate) struct Replayed(DlqReplayOutcome);

impl IntoResponse for Replayed {
    fn into_response(self) -> Response {
        let mut outcome = self.0;
        let status = match outcome.report.stopped_by {
            None => StatusCode::OK,
            Some(StopCause::Unreplayable) => StatusCode::CONFLICT,
            Some(cause) => {
                tracing::error!(
                    ?cause,
                    error = outcome.report.error.as_deref().unwrap_or(""),
                    queue = %outcome.queue,
                    "outbox admin: a dead-letter replay stopped part way"
                );
                outcome.report.error = Some(match cause {
                    StopCause::Store => {
                        "marking the replayed messages' records failed (see the service's log); \
                         they went back, the list still shows them open"
                    }
                    _ => "the broker failed part way (see the service's log); nothing was lost: \
                          replay again when it is back",
                }
                .to_owned());
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        (status, Json(outcome)).into_response()
    }
}

pub(crate) async fn replay<S: OutboxAdmin>(
    State(app): AppState<S>,
    Authenticated(caller): Authenticated,
    body: Body<DlqReplay>,
) -> Result<Replayed, ApiError> {
    operator(&caller, "dlq replay")?;
    let verbs = verbs(&app)?;
    let Body(request) = body;
    let Json(outcome) = detached_with(async move { verbs.replay(&caller, &request).await }).await?;
    Ok(Replayed(outcome))
}

pub(crate) async fn purge<S: OutboxAdmin>(
    State(app): AppState<S>,
    Authenticated(caller): Authenticated,
    body: Body<DlqPurge>,
) -> Result<Json<DlqPurgeOutcome>, ApiError> {
    operator(&caller, "dlq purge")?;
    let verbs = verbs(&app)?;
    let Body(request) = body;
    detached_with(async move { verbs.purge(&caller, &request).await }).await
}
