//! The outbox admin API (`outbox::axum::admin`) at `/admin`, when
//! `ADMIN_TOKEN` is set: status, dead events, replay, skip, purge, relays,
//! audit trail, and the consumers' dead letters (list, groups, replay,
//! purge). See the README's "Admin API".

use axum::Router;
use outbox::admin::{Admin, DeadLetterStore, DeadLetters, OutboxAdmin};
use outbox::axum::admin::{AdminRouter, BearerTokens};
use outbox::rabbitmq::DeadLetterQueues;

use crate::config::Config;

/// The identity of `ADMIN_TOKEN` in the audit trail.
pub const OPERATOR: &str = "admin";
/// The identity of `ADMIN_READ_TOKEN`.
pub const READ_ONLY: &str = "read-only";

/// The admin router over `store` and the consumers' `dead_letters` (their
/// queues on `AMQP_URL`), or `None` (logged at info) when `ADMIN_TOKEN` is
/// not set. Payloads stay redacted: they hold customer data.
///
/// # Errors
/// A token shorter than 16 bytes, or both tokens the same.
pub fn router<S: OutboxAdmin, D: DeadLetterStore>(
    config: &Config,
    store: S,
    dead_letters: D,
) -> Result<Option<Router>, outbox::axum::Error> {
    let Some(token) = &config.admin_token else {
        tracing::info!("admin API off: set ADMIN_TOKEN to enable it");
        return Ok(None);
    };
    let mut tokens = BearerTokens::new().operator(OPERATOR, token);
    if let Some(read) = &config.admin_read_token {
        tokens = tokens.read_only(READ_ONLY, read);
    }
    let dead_letters = DeadLetters::new(dead_letters, DeadLetterQueues::new(&config.amqp_url));
    let router = AdminRouter::builder(Admin::new(store))
        .dead_letters(dead_letters)
        .auth(tokens)
        .build()?;
    tracing::info!(
        read_only = config.admin_read_token.is_some(),
        "admin API on at /admin (bearer tokens)"
    );
    Ok(Some(router))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use axum::body::{Body, to_bytes};
    use axum::http::{Request, StatusCode};
    use metrics_exporter_prometheus::PrometheusBuilder;
    use outbox::axum::OutboxLayer;
    use outbox::testing::InMemoryStore;
    use tower::ServiceExt as _;

    use diesel_async::AsyncPgConnection;
    use outbox::postgres::{PgDeadLetters, PgOutboxStore};

    use super::*;
    use crate::db::Database;
    use crate::routes::{AppState, Health};

    const TOKEN: &str = "0123456789abcdef0123";

    fn config(vars: &[(&str, &str)]) -> Config {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        Config::from_lookup(|name| {
            vars.get(name)
                .map(|v| (*v).to_owned())
                .ok_or(std::env::VarError::NotPresent)
        })
        .unwrap()
    }

    fn store() -> PgOutboxStore {
        // Never connects: nothing here reaches the database.
        let pool = AsyncPgConnection::pool("postgres://nobody@127.0.0.1:1/nothing", 1).unwrap();
        PgOutboxStore::builder(pool).build().unwrap()
    }

    fn dead_letters() -> PgDeadLetters {
        let pool = AsyncPgConnection::pool("postgres://nobody@127.0.0.1:1/nothing", 1).unwrap();
        PgDeadLetters::new(pool)
    }

    #[test]
    fn admin_is_off_without_a_token_and_refuses_a_short_one() {
        assert!(
            router(&config(&[]), store(), dead_letters())
                .unwrap()
                .is_none()
        );
        assert!(
            router(&config(&[("ADMIN_TOKEN", TOKEN)]), store(), dead_letters())
                .unwrap()
                .is_some()
        );
        let err = router(
            &config(&[("ADMIN_TOKEN", "changeme")]),
            store(),
            dead_letters(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("fewer than 16"), "{err}");
    }

    /// Mounted at `/admin` inside the app's layers, next to its routes.
    #[tokio::test]
    async fn the_admin_api_answers_at_admin_behind_its_token() {
        let pool = AsyncPgConnection::pool("postgres://nobody@127.0.0.1:1/nothing", 1).unwrap();
        let admin = AdminRouter::builder(Admin::new(InMemoryStore::new()))
            .auth(BearerTokens::new().operator(OPERATOR, TOKEN))
            .build()
            .unwrap();
        let state = AppState {
            health: Arc::new(Health::new::<AsyncPgConnection>(
                pool.clone(),
                "amqp://127.0.0.1:1/%2f",
            )),
            metrics: PrometheusBuilder::new().build_recorder().handle(),
        };
        let app =
            crate::routes::router::<AsyncPgConnection>(state, OutboxLayer::new(pool), Some(admin));
        let call = |token: Option<&str>, path: &str| {
            let mut request = Request::get(path);
            if let Some(token) = token {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            app.clone().oneshot(request.body(Body::empty()).unwrap())
        };
        let anonymous = call(None, "/admin/status").await.unwrap();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
        let ok = call(Some(TOKEN), "/admin/status").await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let body = to_bytes(ok.into_body(), 1 << 20).await.unwrap();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["counts"]["dead"], 0, "{status}");
        let missing = call(Some(TOKEN), "/orders-nothing").await.unwrap();
        assert_eq!(
            missing.status(),
            StatusCode::NOT_FOUND,
            "the app's fallback still answers"
        );
    }
}
