//! One handler per endpoint: read the request, call [`Admin`], answer
//! JSON. Permissions, chunking and the audit trail are `Admin`'s.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use http::request::Parts;
use outbox_core::admin::{
    ActionReport, Admin, AdminError, AuditRecord, Caller, EventDetail, EventFilter, EventSummary,
    FailureGroup, OutboxAdmin, Page, PurgeTarget, RelayInfo, StatusReport,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::auth::Authenticator;
use super::dead_letters::DeadLetterVerbs;
use super::error::ApiError;
use super::query::{FilterQuery, audit_page};

/// What every handler shares.
pub(crate) struct Shared<S> {
    pub(crate) admin: Admin<S>,
    pub(crate) dead_letters: Option<Arc<dyn DeadLetterVerbs>>,
    pub(crate) auth: Authenticator,
    pub(crate) allow_payloads: bool,
}

pub(crate) type AppState<S> = State<Arc<Shared<S>>>;

type Reply<T> = Result<Json<T>, ApiError>;

/// Runs a mutation on its own task, so that a client that disconnects (or a
/// timeout layer that gives up) does not cancel it between two chunks: it
/// runs to its end and its audit row counts all it changed.
async fn detached<S, T, F, Fut>(app: Arc<Shared<S>>, mutation: F) -> Reply<T>
where
    S: OutboxAdmin,
    T: Send + 'static,
    F: FnOnce(Arc<Shared<S>>) -> Fut,
    Fut: std::future::Future<Output = Result<T, AdminError>> + Send + 'static,
{
    detached_with(mutation(app)).await
}

/// Runs `mutation` on its own task (see [`detached`]).
pub(crate) async fn detached_with<T, Fut>(mutation: Fut) -> Reply<T>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = Result<T, AdminError>> + Send + 'static,
{
    match tokio::spawn(mutation).await {
        Ok(result) => Ok(Json(result?)),
        Err(error) => {
            tracing::error!(%error, "outbox admin: a mutation's task failed");
            Err(ApiError::Admin(AdminError::Store(Box::new(error))))
        }
    }
}

/// The authenticated caller: from the request's extensions, else the
/// router's authenticator; `401` without one.
pub(crate) struct Authenticated(pub(crate) Caller);

impl<S: OutboxAdmin> FromRequestParts<Arc<Shared<S>>> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<Shared<S>>,
    ) -> Result<Self, Self::Rejection> {
        state
            .auth
            .caller(parts)
            .await
            .map(Authenticated)
            .ok_or(ApiError::Unauthenticated)
    }
}

/// An operator, or `403` before anything is read: a read-only caller learns
/// nothing from a mutation's validation or counts.
pub(crate) fn operator(caller: &Caller, action: &'static str) -> Result<(), ApiError> {
    if caller.may_act() {
        Ok(())
    } else {
        Err(AdminError::Forbidden {
            identity: caller.identity.clone(),
            action,
        }
        .into())
    }
}

/// `Json<T>` whose rejections are answered in the router's JSON shape.
pub(crate) struct Body<T>(pub(crate) T);

impl<T: DeserializeOwned, St: Send + Sync> FromRequest<St> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &St) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<T>::from_request(request, state)
            .await
            .map_err(|e: JsonRejection| ApiError::from(e))?;
        Ok(Body(value))
    }
}

/// The query string as a list of pairs (keys may repeat).
type Pairs = Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>;

fn pairs(query: Pairs) -> Result<Vec<(String, String)>, ApiError> {
    Ok(query?.0)
}

fn no_progress(_: u64) {}

pub(crate) async fn status<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
) -> Reply<StatusReport> {
    Ok(Json(app.admin.status().await?))
}

pub(crate) async fn list<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
    query: Pairs,
) -> Reply<Page<EventSummary>> {
    let q = FilterQuery::parse(pairs(query)?, true)?;
    Ok(Json(app.admin.list(&q.filter, q.after, q.limit).await?))
}

pub(crate) async fn show<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
    id: Result<Path<Uuid>, axum::extract::rejection::PathRejection>,
) -> Reply<EventDetail> {
    let Path(id) = id?;
    let detail = app.admin.show(id).await?;
    Ok(Json(if app.allow_payloads {
        detail
    } else {
        detail.redacted()
    }))
}

pub(crate) async fn failure_groups<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
    query: Pairs,
) -> Reply<Vec<FailureGroup>> {
    let q = FilterQuery::parse(pairs(query)?, false)?;
    Ok(Json(app.admin.failure_groups(&q.filter).await?))
}

/// `POST /replay` and `POST /retry-now`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Selection {
    filter: EventFilter,
    #[serde(default)]
    dry_run: bool,
}

pub(crate) async fn replay<S: OutboxAdmin>(
    State(app): AppState<S>,
    Authenticated(caller): Authenticated,
    body: Body<Selection>,
) -> Reply<ActionReport> {
    operator(&caller, "replay")?;
    let Body(s) = body;
    detached(app, move |app| async move {
        app.admin
            .replay(&caller, &s.filter, s.dry_run, &no_progress)
            .await
    })
    .await
}

pub(crate) async fn retry_now<S: OutboxAdmin>(
    State(app): AppState<S>,
    Authenticated(caller): Authenticated,
    body: Body<Selection>,
) -> Reply<ActionReport> {
    operator(&caller, "retry_now")?;
    let Body(s) = body;
    detached(app, move |app| async move {
        app.admin
            .retry_now(&caller, &s.filter, s.dry_run, &no_progress)
            .await
    })
    .await
}

/// `POST /skip`: an event (`id`) or an aggregate's head.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Skip {
    id: Option<Uuid>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

pub(crate) async fn skip<S: OutboxAdmin>(
    State(app): AppState<S>,
    Authenticated(caller): Authenticated,
    body: Body<Skip>,
) -> Reply<ActionReport> {
    operator(&caller, "skip")?;
    let Body(s) = body;
    let report = match (s.id, s.aggregate_type, s.aggregate_id) {
        (Some(id), None, None) => app.admin.skip(&caller, id, s.dry_run).await?,
        (None, Some(kind), Some(id)) => app.admin.skip_head(&caller, &kind, &id, s.dry_run).await?,
        _ => {
            return Err(ApiError::invalid(
                "skip takes either {\"id\": \"<event id>\"} or {\"aggregate_type\": \"...\", \
                 \"aggregate_id\": \"...\"} (the aggregate's head), not both nor neither",
            ));
        }
    };
    Ok(Json(report))
}

/// `POST /purge`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Purge {
    target: PurgeTarget,
    older_than_seconds: u64,
    #[serde(default)]
    dry_run: bool,
}

pub(crate) async fn purge<S: OutboxAdmin>(
    State(app): AppState<S>,
    Authenticated(caller): Authenticated,
    body: Body<Purge>,
) -> Reply<ActionReport> {
    let Body(p) = body;
    operator(
        &caller,
        match p.target {
            PurgeTarget::Inbox => "purge_inbox",
            _ => "purge_sent",
        },
    )?;
    detached(app, move |app| async move {
        app.admin
            .purge(
                &caller,
                p.target,
                Duration::from_secs(p.older_than_seconds),
                p.dry_run,
                &no_progress,
            )
            .await
    })
    .await
}

pub(crate) async fn relays<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
) -> Reply<Vec<RelayInfo>> {
    Ok(Json(app.admin.relays().await?))
}

pub(crate) async fn pause<S: OutboxAdmin>(
    state: AppState<S>,
    caller: Authenticated,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Reply<ActionReport> {
    set_paused(state, caller, name, true).await
}

pub(crate) async fn resume<S: OutboxAdmin>(
    state: AppState<S>,
    caller: Authenticated,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Reply<ActionReport> {
    set_paused(state, caller, name, false).await
}

async fn set_paused<S: OutboxAdmin>(
    State(app): AppState<S>,
    Authenticated(caller): Authenticated,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    paused: bool,
) -> Reply<ActionReport> {
    operator(&caller, if paused { "pause" } else { "resume" })?;
    let Path(name) = name?;
    detached(app, move |app| async move {
        app.admin.set_paused(&caller, &name, paused).await
    })
    .await
}

pub(crate) async fn audit<S: OutboxAdmin>(
    State(app): AppState<S>,
    _caller: Authenticated,
    query: Pairs,
) -> Reply<Vec<AuditRecord>> {
    let (before, limit) = audit_page(pairs(query)?)?;
    Ok(Json(app.admin.audit_log(before, limit).await?))
}
