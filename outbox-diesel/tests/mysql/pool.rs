//! `pool_with_session`: the application's session settings on every
//! pooled connection, and a setting the server refuses is an error.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use outbox_diesel::mysql::pool_with_session;
use outbox_testkit::urls::mysql_url;

#[derive(QueryableByName)]
struct Isolation {
    #[diesel(sql_type = Text)]
    level: String,
}

#[tokio::test]
async fn every_pooled_connection_runs_the_session_statements() {
    let pool = pool_with_session(
        &mysql_url(),
        2,
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    )
    .unwrap();
    // Two connections at once: both were set up, not only the first.
    let mut a = pool.get().await.unwrap();
    let mut b = pool.get().await.unwrap();
    for conn in [&mut a, &mut b] {
        let isolation: Isolation = diesel::sql_query("SELECT @@tx_isolation AS level")
            .get_result(&mut **conn)
            .await
            .unwrap();
        assert_eq!(isolation.level, "READ-COMMITTED");
    }
    // The plain pool keeps the server's default.
    let plain = outbox_diesel::mysql::pool(&mysql_url(), 1).unwrap();
    let isolation: Isolation = diesel::sql_query("SELECT @@tx_isolation AS level")
        .get_result(&mut *plain.get().await.unwrap())
        .await
        .unwrap();
    assert_eq!(isolation.level, "REPEATABLE-READ");
}

#[tokio::test]
async fn a_session_statement_the_server_refuses_fails_the_checkout() {
    let pool = pool_with_session(&mysql_url(), 1, "SET SESSION no_such_variable = 1").unwrap();
    let Err(error) = pool.get().await else {
        panic!("a connection whose session setup failed was handed out");
    };
    let text = outbox_diesel::Error::from(error).to_string();
    assert!(text.contains("no_such_variable"), "{text}");
}
