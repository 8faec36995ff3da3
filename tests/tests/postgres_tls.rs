//! TLS to PostgreSQL (feature `postgres-tls`), against a private cluster
//! with `ssl = on`, a certificate for `localhost` signed by a test CA, and
//! TLS only (a plaintext TCP connection is rejected by `pg_hba.conf`): every
//! connection the library opens honours `sslmode` and `sslrootcert` with
//! libpq's meanings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use diesel::sql_types::Bool;
use diesel_async::{AsyncConnection as _, AsyncPgConnection, RunQueryDsl as _};
use outbox::DomainEvent;
use outbox::postgres::{Error, Outbox, PgOutboxStore};
use outbox::testing::{RecordingPublisher, wakeup_driven};
use outbox_testkit::eventually::eventually;
use outbox_testkit::pg;
use outbox_testkit::pki::TestPki;
use outbox_testkit::servers::PrivatePostgres;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id]
    order: u32,
}

/// `postgres://postgres@HOST:PORT/postgres?hostaddr=127.0.0.1&...`: the
/// server is always reached at 127.0.0.1; `host` is the name the
/// certificate is checked against under `verify-full`.
fn url(pg: &PrivatePostgres, host: &str, params: &str) -> String {
    format!(
        "postgres://postgres@{host}:{}/postgres?hostaddr=127.0.0.1&{params}",
        pg.port()
    )
}

/// Whether this session is encrypted, from the server's side.
async fn encrypted(conn: &mut AsyncPgConnection) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Ssl {
        #[diesel(sql_type = Bool)]
        ssl: bool,
    }
    diesel::sql_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .get_result::<Ssl>(conn)
        .await
        .unwrap()
        .ssl
}

async fn connects(url: &str) -> Result<(), Error> {
    let mut conn = outbox::postgres::connect(url).await?;
    assert!(
        encrypted(&mut conn).await,
        "{url}: connected, but in plaintext"
    );
    Ok(())
}

/// The handshake failed on the certificate (not on anything else).
fn refused_certificate(url: &str, result: Result<(), Error>) {
    match result {
        Err(Error::Connect { source, .. }) => {
            let text = source.to_string();
            assert!(
                text.contains("TLS") && text.contains("certificate"),
                "{url}: refused, but not for its certificate: {text}"
            );
        }
        other => panic!("{url}: the certificate must be refused, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn certificates_are_checked_as_libpq_does() {
    let pki = TestPki::generate();
    let pg = PrivatePostgres::start_tls(&pki);
    let ca = pki.ca().display().to_string();
    let other_ca = pki.other_ca().display().to_string();

    // `require`: encrypted, any certificate.
    connects(&url(&pg, "localhost", "sslmode=require"))
        .await
        .unwrap();
    connects(&url(&pg, "wrong.example", "sslmode=require"))
        .await
        .unwrap();
    // `prefer` (and libpq's default, no sslmode): encrypted when offered.
    connects(&url(&pg, "localhost", "sslmode=prefer"))
        .await
        .unwrap();
    connects(&format!("{}?sslmode=prefer", pg.url()))
        .await
        .unwrap();
    connects(&pg.url()).await.unwrap();
    // `disable` is plaintext, which this server rejects: the connections
    // above were encrypted because TLS was used, not by chance.
    let plain = url(&pg, "localhost", "sslmode=disable");
    let err = outbox::postgres::connect(&plain)
        .await
        .err()
        .expect("plaintext is rejected");
    assert!(err.to_string().contains("no encryption"), "{err}");

    // `verify-ca`: the chain, not the name.
    connects(&url(
        &pg,
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .await
    .unwrap();
    connects(&url(
        &pg,
        "wrong.example",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .await
    .unwrap();
    let wrong_root = url(
        &pg,
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={other_ca}"),
    );
    refused_certificate(&wrong_root, connects(&wrong_root).await);
    // A root given to `require` is used, as libpq does.
    let wrong_root = url(
        &pg,
        "localhost",
        &format!("sslmode=require&sslrootcert={other_ca}"),
    );
    refused_certificate(&wrong_root, connects(&wrong_root).await);

    // `verify-full`: the chain and the host name.
    connects(&url(
        &pg,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .unwrap();
    for wrong_name in ["wrong.example", "127.0.0.1"] {
        let wrong = url(
            &pg,
            wrong_name,
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        );
        refused_certificate(&wrong, connects(&wrong).await);
    }
    let wrong_root = url(
        &pg,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={other_ca}"),
    );
    refused_certificate(&wrong_root, connects(&wrong_root).await);
    // libpq's key/value form too.
    connects(&format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-full sslrootcert='{ca}'",
        pg.port()
    ))
    .await
    .unwrap();

    // Without a root, `verify-*` is refused before connecting.
    let no_root = url(&pg, "localhost", "sslmode=verify-full");
    match outbox::postgres::connect(&no_root).await.err() {
        Some(Error::Tls { reason, .. }) => assert!(reason.contains("sslrootcert"), "{reason}"),
        other => panic!("verify-full without a root must be refused: {other:?}"),
    }
    assert!(matches!(
        outbox::postgres::pool(&no_root, 1),
        Err(Error::Tls { .. })
    ));
}

/// The pool, migrations and the relay's `LISTEN` connection, under
/// `verify-full`: the relay is woken through `LISTEN` (polling is an hour).
/// And a pool whose URL names the wrong host gets no connection.
#[tokio::test(flavor = "multi_thread")]
async fn pool_migrations_and_listen_use_tls() {
    let pki = TestPki::generate();
    let pg = PrivatePostgres::start_tls(&pki);
    let verified = url(
        &pg,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", pki.ca().display()),
    );

    assert_eq!(
        outbox::postgres::migrate_url(&verified, "public")
            .await
            .unwrap(),
        vec![1, 2, 3, 4, 5]
    );
    let pool = outbox::postgres::pool(&verified, 4).unwrap();
    let store = PgOutboxStore::builder(pool.clone())
        .listen(&verified)
        .build()
        .unwrap();
    let publisher = RecordingPublisher::new();
    let relay = wakeup_driven(store, publisher.clone()).build().unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    // Wait for the LISTEN session, so the event below needs its NOTIFY.
    let mut monitor = pool.get().await.unwrap();
    assert!(
        encrypted(&mut monitor).await,
        "pooled connections are encrypted"
    );
    let monitor = tokio::sync::Mutex::new(monitor);
    eventually("an encrypted LISTEN session")
        .every(Duration::from_millis(20))
        .equals(1, || async {
            pg::count(
                &mut *monitor.lock().await,
                "SELECT count(*) AS n FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.state = 'idle' AND a.query LIKE 'LISTEN %' AND s.ssl",
            )
            .await
        })
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = publisher.published_ids().len();

    let mut conn = outbox::postgres::connect(&verified).await.unwrap();
    let id = conn
        .transaction::<_, Error, _>(async |conn| {
            Outbox::default()
                .record(conn, &OrderPlaced { order: 1 })
                .await
        })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), publisher.wait_for(before + 1))
        .await
        .expect("the relay, woken through its LISTEN connection, published the event");
    assert_eq!(publisher.published_ids().last(), Some(&id));
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();

    // A pool checks each connection's certificate too.
    let wrong = url(
        &pg,
        "wrong.example",
        &format!("sslmode=verify-full&sslrootcert={}", pki.ca().display()),
    );
    let pool = outbox::postgres::pool(&wrong, 1).unwrap();
    let err = pool
        .get()
        .await
        .err()
        .expect("no connection for the wrong host name");
    assert!(err.to_string().contains("certificate"), "{err}");
}
