//! `outbox_diesel::pool` never waits forever for a connection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

#[tokio::test]
async fn a_database_that_never_answers_fails_get_within_the_connect_timeout() {
    // A listener that accepts TCP connections and never speaks PostgreSQL.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let pool =
        outbox_diesel::pool(&format!("postgres://postgres@127.0.0.1:{port}/postgres"), 1).unwrap();
    let started = Instant::now();
    let result = pool.get().await;
    let waited = started.elapsed();
    let error = result.err().expect("no connection from a silent server");
    assert!(
        // The connector's own limit ("timed out: no answer within 10 s")
        // or deadpool's ("Timeout occurred while creating a new object").
        ["timed out", "timeout occurred"]
            .iter()
            .any(|said| error.to_string().to_lowercase().contains(said)),
        "a timeout error: {error}"
    );
    assert!(
        waited >= outbox_diesel::POOL_CONNECT_TIMEOUT - Duration::from_millis(100)
            && waited < outbox_diesel::POOL_CONNECT_TIMEOUT + Duration::from_secs(5),
        "failed after {waited:?}, expected about {:?}",
        outbox_diesel::POOL_CONNECT_TIMEOUT
    );
}
