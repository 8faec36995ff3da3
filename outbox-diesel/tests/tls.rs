//! Without the `postgres-tls` feature every connection is plaintext, so a
//! URL that asks for TLS is refused with an error naming the feature, by
//! every function that connects, never answered with a plaintext
//! connection. (With the feature, `tests/tests/postgres_tls.rs` of the
//! workspace checks each `sslmode` against a TLS-only server.)
#![cfg(not(feature = "postgres-tls"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use diesel_async::RunQueryDsl as _;
use outbox_diesel::Error;

/// `DATABASE_URL` with `param` added to its query.
fn with_param(param: &str) -> String {
    let url = common::database_url();
    let glue = if url.contains('?') { '&' } else { '?' };
    format!("{url}{glue}{param}")
}

fn assert_names_the_feature(what: &str, err: Option<Error>) {
    match err {
        Some(Error::Tls { reason, .. }) => {
            assert!(reason.contains("`postgres-tls`"), "{what}: {reason}");
        }
        other => panic!("{what}: must be refused with Error::Tls, got {other:?}"),
    }
}

#[tokio::test]
async fn urls_asking_for_tls_are_refused_naming_the_feature() {
    for param in [
        "sslmode=require",
        "sslmode=verify-ca&sslrootcert=/etc/ssl/ca.pem",
        "sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem",
        "sslrootcert=/etc/ssl/ca.pem",
    ] {
        let url = with_param(param);
        assert_names_the_feature(&url, outbox_diesel::connect(&url).await.err());
        assert_names_the_feature(&url, outbox_diesel::pool(&url, 1).err());
        assert_names_the_feature(&url, outbox_diesel::migrate_url(&url, "public").await.err());
    }
}

#[tokio::test]
async fn prefer_and_disable_connect_in_plaintext() {
    #[derive(diesel::QueryableByName)]
    struct Ssl {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        ssl: bool,
    }
    for param in ["sslmode=prefer", "sslmode=disable"] {
        let mut conn = outbox_diesel::connect(&with_param(param)).await.unwrap();
        let ssl: Ssl =
            diesel::sql_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .get_result(&mut conn)
                .await
                .unwrap();
        assert!(!ssl.ssl, "{param}: this build has no TLS");
    }
}
