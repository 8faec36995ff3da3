//! The admin API over HTTP: the verbs of [`outbox_core::admin::Admin`] as
//! JSON endpoints, in a [`Router`] you mount under any prefix.
//!
//! ```no_run
//! use axum::Router;
//! use outbox_axum::admin::{AdminRouter, BearerTokens};
//! use outbox_core::admin::Admin;
//! use outbox_diesel::PgOutboxStore;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let pool = outbox_diesel::pool("postgres://postgres@127.0.0.1:5432/app", 4)?;
//!     let store = PgOutboxStore::builder(pool).build()?;
//!     let tokens = BearerTokens::new()
//!         .operator("admin", std::env::var("ADMIN_TOKEN")?)
//!         .read_only("grafana", std::env::var("ADMIN_READ_TOKEN")?);
//!     // Fails when a token is empty or shorter than 16 bytes.
//!     let admin = AdminRouter::builder(Admin::new(store)).auth(tokens).build()?;
//!
//!     let app = Router::new().nest("/admin", admin);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! ```
//!
//! ```text
//! curl -s -H "Authorization: Bearer $ADMIN_TOKEN" 'localhost:3000/admin/events?status=dead'
//! curl -s -H "Authorization: Bearer $ADMIN_TOKEN" -H 'content-type: application/json' \
//!      -d '{"filter": {"statuses": ["dead"], "event_type": "order.placed"}, "dry_run": true}' \
//!      localhost:3000/admin/replay
//! ```
//!
//! # Endpoints
//! Paths are relative to where the router is mounted. Every endpoint needs
//! a caller; `GET`s are open to read-only callers, `POST`s need an
//! operator. Every `POST` that changes something writes an audit row with
//! the caller's identity (see `GET /audit`) and answers the
//! [`ActionReport`](outbox_core::admin::ActionReport); with `"dry_run":
//! true` it only counts.
//!
//! | Method and path | Request | Answer |
//! |---|---|---|
//! | `GET /status` | | [`StatusReport`](outbox_core::admin::StatusReport) |
//! | `GET /events` | query: the filter (below), `after=<seq>` (cursor), `limit=` (default 100, at most 10000) | [`Page`](outbox_core::admin::Page) of [`EventSummary`](outbox_core::admin::EventSummary); `next` is the next page's `after` |
//! | `GET /events/{id}` | | [`EventDetail`](outbox_core::admin::EventDetail), payload and headers `null` unless [`allow_payloads`](AdminRouterBuilder::allow_payloads) |
//! | `GET /failure-groups` | query: the filter | [`FailureGroup`](outbox_core::admin::FailureGroup)s |
//! | `POST /replay` | `{"filter": <EventFilter>, "dry_run": false}` | `dead` events back to `pending`, order kept |
//! | `POST /skip` | `{"id": "<uuid>"}` or `{"aggregate_type": "...", "aggregate_id": "..."}`, and `"dry_run"` | the event, or the aggregate's head, skipped |
//! | `POST /retry-now` | `{"filter": <EventFilter>, "dry_run": false}` | waiting retries due now |
//! | `POST /purge` | `{"target": "sent" \| "inbox", "older_than_seconds": 86400, "dry_run": false}` | sent events or inbox entries deleted |
//! | `GET /relays` | | [`RelayInfo`](outbox_core::admin::RelayInfo)s |
//! | `POST /relays/{name}/pause`, `POST /relays/{name}/resume` | | the relay paused or resumed |
//! | `GET /audit` | query: `before=<id>`, `limit=` (default 100) | [`AuditRecord`](outbox_core::admin::AuditRecord)s, newest first |
//! | `GET /dead-letters` | query: `queue=<consumer queue>`, `after=<id>`, `limit=` (default 100, at most 1000), `all=true` (replayed and purged ones too) | [`Page`](outbox_core::admin::Page) of [`DeadLetterRecord`](outbox_core::admin::DeadLetterRecord)s in the order they were dead-lettered; unless [`allow_payloads`](AdminRouterBuilder::allow_payloads), payload `""`, headers `{}` and `"redacted": true` (and they are not read from the database) |
//! | `GET /dead-letters/{id}` | | one [`DeadLetterRecord`](outbox_core::admin::DeadLetterRecord), redacted likewise |
//! | `GET /dead-letter-groups` | query: `queue=` | open dead letters as [`DeadLetterGroup`](outbox_core::admin::DeadLetterGroup)s |
//! | `POST /dead-letters/replay` | a [`DlqReplay`](outbox_core::admin::DlqReplay): `{"queue": "<dead-letter queue>", "limit": 100, "skip_unreplayable": false, "dry_run": false}` | [`DlqReplayOutcome`](outbox_core::admin::DlqReplayOutcome): each message back to its queue, confirmed before it leaves the dead-letter queue; with the same body, `409` when it stopped on a message that cannot go back and `503` when the broker or the store failed part way (`error` and `stopped_by` say which; what moved before is done and counted) |
//! | `POST /dead-letters/purge` | a [`DlqPurge`](outbox_core::admin::DlqPurge): `{"queue": "...", "origins": ["<consumer queue>"], "dry_run": false}` | [`DlqPurgeOutcome`](outbox_core::admin::DlqPurgeOutcome) |
//!
//! The dead-letter endpoints need
//! [`dead_letters`](AdminRouterBuilder::dead_letters) (they answer `404`
//! without); they list the records consumers write when they dead-letter a
//! message (never the queue: getting and requeueing reorders it), and act
//! on the broker's queue through
//! [`DeadLetters`].
//!
//! The filter in a query string: `status` (repeatable:
//! `?status=dead&status=retry`), `id` (repeatable), `aggregate_type`,
//! `aggregate_id`, `event_type`, `error` (the last error contains it,
//! case-insensitive), `group` (a failure group's id), `occurred_after`,
//! `occurred_before` (RFC 3339). In a body it is an
//! [`EventFilter`](outbox_core::admin::EventFilter) as JSON (`statuses`,
//! `ids`, `error_contains`, ...); unknown fields are refused. `"dry_run"`
//! defaults to `false`.
//!
//! The CLI's schema commands (`outbox migrate`, `outbox ddl`, `outbox
//! explain-claim`) have no endpoint on purpose: migrations need DDL rights a
//! service's runtime role should not hold, and the other two are a DBA's
//! tools (`explain-claim` runs the claim's statement, taking its row locks).
//!
//! # Errors
//! Every error is JSON, `{"error": "<what to change>"}`:
//!
//! | Status | When |
//! |---|---|
//! | `400` | a malformed body or query string, an unknown field or parameter, a selection the verb refuses (e.g. an empty filter for a replay) |
//! | `401` + `WWW-Authenticate: Bearer` | no caller: no token, a wrong one, no [`Caller`](outbox_core::admin::Caller) from your layer |
//! | `403` | a read-only caller asked for a mutation (checked before anything is read) |
//! | `404` | no such event, aggregate head, relay, dead letter or queue |
//! | `409` | a dead-letter queue with consumers (a replay of it runs, or it is a live queue), or a replay that stopped on a message it cannot send back (the body is then the replay's outcome) |
//! | `415` | a `POST` body without `Content-Type: application/json` (required, so a browser cannot send it cross-site without a CORS preflight) |
//! | `503` | the store or the broker failed (the details are in the log, not in the answer) |
//!
//! # Authentication
//! The router refuses to build without a choice:
//! - [`BearerTokens`]: `Authorization: Bearer <token>`, compared in constant
//!   time, each token with an identity and a role; or
//! - your own [`AdminAuth`] (async, so it may look a token up); or
//! - [`LayerAuth`]: a layer of yours authenticates and inserts a
//!   [`Caller`](outbox_core::admin::Caller) into the request's extensions;
//!   or
//! - [`allow_anonymous`](AdminRouterBuilder::allow_anonymous): every
//!   request is an operator named `anonymous` (for a router reachable only
//!   from a trusted network; a warning is logged at build).
//!
//! Whatever the choice, a [`Caller`](outbox_core::admin::Caller) already in
//! the request's extensions wins.
//!
//! ```
//! use axum::Router;
//! use axum::extract::Request;
//! use axum::middleware::{self, Next};
//! use outbox_axum::admin::{AdminRouter, LayerAuth};
//! use outbox_core::admin::{Admin, Caller};
//! use outbox_core::testing::InMemoryStore;
//!
//! async fn sso(mut request: Request, next: Next) -> axum::response::Response {
//!     // Checked by your ingress; here only trusted because it says so.
//!     if let Some(user) = request.headers().get("x-forwarded-user") {
//!         let caller = Caller::operator(format!("sso:{}", user.to_str().unwrap_or("?")));
//!         request.extensions_mut().insert(caller);
//!     }
//!     next.run(request).await
//! }
//!
//! # fn main() -> Result<(), outbox_axum::Error> {
//! let admin = AdminRouter::builder(Admin::new(InMemoryStore::new()))
//!     .auth(LayerAuth)
//!     .build()?
//!     .layer(middleware::from_fn(sso));
//! let app: Router = Router::new().nest("/admin", admin);
//! # Ok(())
//! # }
//! ```
//!
//! # Design notes
//! - The router is a `Router` with no state left to provide, so it nests
//!   anywhere; its own state (the [`Admin`], the authenticator) is inside.
//! - Authentication is an extractor run before the body is read: a request
//!   without a caller gets `401` even when its body is malformed.
//! - The router checks the operator role itself before calling [`Admin`]
//!   (which checks it again), so a read-only caller gets `403` before the
//!   selection is validated or counted.

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::http::Uri;
use axum::routing::{get, post};
use outbox_core::admin::{Admin, DeadLetterBroker, DeadLetterStore, DeadLetters, OutboxAdmin};

use crate::Error;

mod auth;
mod dead_letters;
mod error;
mod handlers;
mod query;

pub use auth::{ANONYMOUS, AdminAuth, BearerTokens, LayerAuth, MIN_TOKEN_LEN};

use auth::Authenticator;
use dead_letters::DeadLetterVerbs;
use error::ApiError;
use handlers::Shared;

/// The admin router: start with [`AdminRouter::builder`].
#[derive(Debug)]
#[non_exhaustive]
pub struct AdminRouter;

impl AdminRouter {
    /// A builder of the router over `admin` (its chunk size, pause and
    /// dedup window apply).
    pub fn builder<S: OutboxAdmin>(admin: Admin<S>) -> AdminRouterBuilder<S> {
        AdminRouterBuilder {
            admin,
            dead_letters: None,
            auth: None,
            anonymous: false,
            allow_payloads: false,
        }
    }
}

/// Configures the admin router; see the [module docs](self).
#[must_use = "call `.build()` to get the router"]
pub struct AdminRouterBuilder<S> {
    admin: Admin<S>,
    dead_letters: Option<Arc<dyn DeadLetterVerbs>>,
    auth: Option<(Authenticator, Result<(), Error>)>,
    anonymous: bool,
    allow_payloads: bool,
}

impl<S> fmt::Debug for AdminRouterBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminRouterBuilder")
            .field("auth", &self.auth.is_some())
            .field("anonymous", &self.anonymous)
            .field("allow_payloads", &self.allow_payloads)
            .field("dead_letters", &self.dead_letters.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: OutboxAdmin> AdminRouterBuilder<S> {
    /// Authenticates requests with `auth` ([`BearerTokens`], [`LayerAuth`]
    /// or your own); checked at [`build`](Self::build).
    pub fn auth(mut self, auth: impl AdminAuth) -> Self {
        let valid = auth.validate();
        self.auth = Some((Authenticator::Auth(Arc::new(auth)), valid));
        self
    }

    /// No authentication: every request without a
    /// [`Caller`](outbox_core::admin::Caller) in its extensions is an
    /// operator named [`ANONYMOUS`]. Only for a router reachable from a
    /// trusted network alone; [`build`](Self::build) logs a warning.
    pub fn allow_anonymous(mut self) -> Self {
        self.anonymous = true;
        self
    }

    /// Whether `GET /events/{id}` and the dead-letter listings show
    /// payloads and headers (default `false`: an event's are `null`, a dead
    /// letter's empty and marked `"redacted": true`). Payloads often hold
    /// personal data. Failure reasons are shown either way (operators group
    /// by them): keep payload values out of your handlers' error texts.
    pub fn allow_payloads(mut self, allow: bool) -> Self {
        self.allow_payloads = allow;
        self
    }

    /// Serves consumers' dead letters too (`/dead-letters`,
    /// `/dead-letter-groups`), through `verbs` (e.g. over
    /// `outbox_diesel::PgDeadLetters` and `outbox_lapin::DeadLetterQueues`).
    /// Without it those endpoints answer `404` saying so.
    pub fn dead_letters<D, B>(mut self, verbs: DeadLetters<D, B>) -> Self
    where
        D: DeadLetterStore,
        B: DeadLetterBroker,
    {
        self.dead_letters = Some(Arc::new(verbs));
        self
    }

    /// The router, to [`nest`](Router::nest) under a prefix of your choice.
    ///
    /// # Errors
    /// [`Error::AdminConfig`] when neither [`auth`](Self::auth) nor
    /// [`allow_anonymous`](Self::allow_anonymous) was called, when both
    /// were, or when the authentication is misconfigured (e.g. a bearer
    /// token shorter than [`MIN_TOKEN_LEN`] bytes).
    pub fn build(self) -> Result<Router, Error> {
        let auth = match (self.auth, self.anonymous) {
            (None, false) => {
                return Err(Error::AdminConfig(
                    "no authentication: call `.auth(BearerTokens::new().operator(identity, \
                     token))` (or `.auth(LayerAuth)` behind a layer that inserts a `Caller`), \
                     or `.allow_anonymous()` for a router reachable only from a trusted network"
                        .into(),
                ));
            }
            (Some(_), true) => {
                return Err(Error::AdminConfig(
                    "both `.auth(..)` and `.allow_anonymous()` were called: choose one".into(),
                ));
            }
            (Some((auth, valid)), false) => {
                valid?;
                auth
            }
            (None, true) => {
                tracing::warn!(
                    "outbox admin API without authentication: every request acts as an operator \
                     named {ANONYMOUS:?}; reach it only from a trusted network"
                );
                Authenticator::Anonymous
            }
        };
        let shared = Arc::new(Shared {
            admin: self.admin,
            dead_letters: self.dead_letters,
            auth,
            allow_payloads: self.allow_payloads,
        });
        Ok(Router::new()
            .route("/status", get(handlers::status::<S>))
            .route("/events", get(handlers::list::<S>))
            .route("/events/{id}", get(handlers::show::<S>))
            .route("/failure-groups", get(handlers::failure_groups::<S>))
            .route("/replay", post(handlers::replay::<S>))
            .route("/skip", post(handlers::skip::<S>))
            .route("/retry-now", post(handlers::retry_now::<S>))
            .route("/purge", post(handlers::purge::<S>))
            .route("/relays", get(handlers::relays::<S>))
            .route("/relays/{name}/pause", post(handlers::pause::<S>))
            .route("/relays/{name}/resume", post(handlers::resume::<S>))
            .route("/audit", get(handlers::audit::<S>))
            .route("/dead-letters", get(dead_letters::list::<S>))
            .route("/dead-letters/{id}", get(dead_letters::show::<S>))
            .route("/dead-letters/replay", post(dead_letters::replay::<S>))
            .route("/dead-letters/purge", post(dead_letters::purge::<S>))
            .route("/dead-letter-groups", get(dead_letters::groups::<S>))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(axum::middleware::from_fn(json_posts_only))
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(shared))
    }
}

/// The largest request body the admin router reads (a filter is small).
const MAX_BODY_BYTES: usize = 256 * 1024;

/// Every `POST` must declare a JSON body, also those that carry none
/// (pause, resume): a browser sends such a request cross-site only after a
/// CORS preflight, so a page visited by an operator cannot act through a
/// cookie-based auth layer or an anonymous router.
async fn json_posts_only(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let json = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if request.method() == http::Method::POST && !json {
        return ApiError::Request(
            http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "admin POST requests must be sent with Content-Type: application/json (an empty \
             body is fine for pause and resume)"
                .into(),
        )
        .into_response();
    }
    next.run(request).await
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::Request(
        http::StatusCode::NOT_FOUND,
        format!(
            "no admin endpoint at {}; see the outbox_axum::admin docs",
            uri.path()
        ),
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::Request(
        http::StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: the admin API reads with GET and acts with POST".into(),
    )
}
