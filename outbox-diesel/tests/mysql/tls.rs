//! TLS to MariaDB. With the `mysql-tls` feature: against a private
//! `mariadbd` of the test's own (testkit's `PrivateMariadb`, serving a
//! certificate for `localhost` signed by the test CA), each URL connects
//! the way it says or is refused saying why. Without it: a URL asking for
//! TLS is refused by every function that connects, naming the feature.

#[cfg(feature = "mysql-tls")]
mod with_the_feature {
    use std::path::Path;

    use diesel::QueryableByName;
    use diesel::sql_types::Text;
    use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
    use outbox_core::testing::TestEvent;
    use outbox_core::{Claim, OutboxStore};
    use outbox_diesel::Error;
    use outbox_diesel::mysql::{self, MysqlSettings, MysqlTransaction};
    use outbox_testkit::pki::TestPki;
    use outbox_testkit::servers::PrivateMariadb;

    #[derive(QueryableByName)]
    struct Status {
        #[diesel(sql_type = Text, column_name = "Value")]
        value: String,
    }

    /// The session's TLS cipher, `""` when it is plaintext.
    async fn cipher(conn: &mut AsyncMysqlConnection) -> String {
        diesel::sql_query("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .get_result::<Status>(conn)
            .await
            .unwrap()
            .value
    }

    /// `url` verifying the certificate's chain to `ca` and its name.
    fn verified(url: &str, ca: &Path) -> String {
        format!(
            "{url}?require_ssl=true&verify_ca=true&verify_identity=true&ssl_ca={}",
            ca.display()
        )
    }

    /// The `Error::Connect` of `result`, as text with its source.
    fn connect_error<T>(what: &str, result: Result<T, Error>) -> String {
        match result {
            Err(error @ Error::Connect { .. }) => {
                let source = std::error::Error::source(&error)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                format!("{error}: {source}")
            }
            Err(other) => panic!("{what}: must fail with Error::Connect, got {other:?}"),
            Ok(_) => panic!("{what}: connected"),
        }
    }

    #[tokio::test]
    async fn tls_verify_identity_with_the_right_ca_records_and_claims_an_event() {
        let pki = TestPki::generate();
        let server = PrivateMariadb::start(&pki);
        let url = verified(&server.url(), &pki.ca());

        mysql::migrate_url(&url).await.unwrap();
        let mut direct = mysql::connect(&url).await.unwrap();
        assert!(
            cipher(&mut direct).await.starts_with("TLS_"),
            "connect is encrypted"
        );
        let pool = mysql::pool(&url, 2).unwrap();
        let mut tx = MysqlTransaction::begin(&pool).await.unwrap();
        assert!(
            cipher(&mut tx).await.starts_with("TLS_"),
            "the pool's connections are encrypted, not moved to the Unix socket"
        );
        let id = mysql::record(&mut tx, &TestEvent::new("order-1"))
            .await
            .unwrap();
        tx.commit().await.unwrap();

        let store = MysqlSettings::default().store(pool.clone());
        let mut claim = store.claim(10).await.unwrap().expect("the recorded event");
        let ids: Vec<_> = claim.records().iter().map(|r| r.envelope.id).collect();
        assert_eq!(ids, vec![id]);
        let seqs: Vec<i64> = claim.records().iter().map(|r| r.seq).collect();
        claim.mark_sent(&seqs).await.unwrap();
        claim.finish().await.unwrap();
        assert!(store.claim(10).await.unwrap().is_none(), "sent");
    }

    #[tokio::test]
    async fn tls_a_wrong_ca_or_host_name_is_refused_saying_why() {
        let pki = TestPki::generate();
        let server = PrivateMariadb::start(&pki);

        let url = verified(&server.url(), &pki.other_ca());
        let text = connect_error("another CA", mysql::connect(&url).await);
        assert!(text.contains("UnknownIssuer"), "{text}");
        assert!(!text.contains(PrivateMariadb::PASSWORD), "{text}");
        let pool = mysql::pool(&url, 1).unwrap();
        let error = MysqlTransaction::begin(&pool).await.unwrap_err();
        assert!(error.to_string().contains("UnknownIssuer"), "{error}");

        // The certificate names `localhost` only, not 127.0.0.1.
        let by_ip = server.url().replace("@localhost:", "@127.0.0.1:");
        let text = connect_error(
            "127.0.0.1 with verify_identity",
            mysql::connect(&verified(&by_ip, &pki.ca())).await,
        );
        assert!(text.contains("not valid for name"), "{text}");
        // verify_identity=false cannot be honoured by mysql_async 0.36 (it
        // checks the name anyway): refused, saying so.
        let chain_only = format!(
            "{by_ip}?require_ssl=true&verify_identity=false&ssl_ca={}",
            pki.ca().display()
        );
        match mysql::connect(&chain_only).await {
            Err(Error::Tls { reason, .. }) => {
                assert!(reason.contains("verify_identity=false"), "{reason}");
            }
            other => panic!(
                "verify_identity=false: must be refused, got {:?}",
                other.err()
            ),
        }

        // An ssl_ca that cannot be read is refused before connecting.
        let missing = pki.dir().join("missing.pem");
        let url = verified(&server.url(), &missing);
        assert!(
            matches!(mysql::pool(&url, 1), Err(Error::Tls { ref reason, .. }) if reason.contains("missing.pem")),
            "a missing ssl_ca"
        );
        let url = format!("{}?sslmode=REQUIRED", server.url());
        assert!(
            matches!(mysql::connect(&url).await, Err(Error::Tls { ref reason, .. }) if reason.contains("`sslmode`")),
            "an unknown TLS parameter"
        );
    }

    #[tokio::test]
    async fn tls_plaintext_still_connects_when_the_server_allows_it() {
        let pki = TestPki::generate();
        let server = PrivateMariadb::start(&pki);
        let plaintext = [
            server.url(),
            format!("{}?require_ssl=false", server.url()),
            // require_ssl=false wins over ssl_ca (which is then not read).
            format!(
                "{}?require_ssl=false&ssl_ca=/nonexistent/ca.pem",
                server.url()
            ),
        ];
        for url in plaintext {
            let mut conn = mysql::connect(&url).await.unwrap();
            assert_eq!(cipher(&mut conn).await, "", "{url}: plaintext");
        }
    }

    #[tokio::test]
    async fn tls_a_server_requiring_tls_refuses_plaintext_clearly() {
        let pki = TestPki::generate();
        let server = PrivateMariadb::start_tls_only(&pki);

        let text = connect_error("plaintext", mysql::connect(&server.url()).await);
        assert!(text.contains("Access denied"), "{text}");
        assert!(text.contains("require_ssl=true"), "says what to do: {text}");
        let pool = mysql::pool(&server.url(), 1).unwrap();
        assert!(
            MysqlTransaction::begin(&pool).await.is_err(),
            "the pool too"
        );

        let mut conn = mysql::connect(&verified(&server.url(), &pki.ca()))
            .await
            .unwrap();
        assert!(cipher(&mut conn).await.starts_with("TLS_"));
    }
}

#[cfg(not(feature = "mysql-tls"))]
mod without_the_feature {
    use outbox_diesel::Error;
    use outbox_diesel::mysql;
    use outbox_testkit::urls::mysql_url;

    fn assert_names_the_feature<T>(what: &str, result: Result<T, Error>) {
        match result {
            Err(Error::Tls { reason, .. }) => {
                assert!(reason.contains("`mysql-tls`"), "{what}: {reason}");
            }
            Err(other) => panic!("{what}: must be refused with Error::Tls, got {other:?}"),
            Ok(_) => panic!("{what}: a TLS URL connected in plaintext"),
        }
    }

    #[tokio::test]
    async fn tls_urls_asking_for_it_are_refused_naming_the_feature() {
        // Refused before connecting: no database of the test's own needed.
        let server = mysql_url();
        let glue = if server.contains('?') { '&' } else { '?' };
        for param in [
            "require_ssl=true",
            "verify_identity=true",
            "ssl_ca=/etc/ssl/ca.pem",
            "require_ssl=true&ssl_ca=/etc/ssl/ca.pem",
        ] {
            let url = format!("{server}{glue}{param}");
            assert_names_the_feature(&url, mysql::connect(&url).await);
            assert_names_the_feature(&url, mysql::pool(&url, 1));
            assert_names_the_feature(&url, mysql::migrate_url(&url).await);
        }
        // require_ssl=false asks for plaintext: fine without the feature.
        let url = format!("{server}{glue}require_ssl=false&ssl_ca=/etc/ssl/ca.pem");
        mysql::connect(&url).await.unwrap();
    }
}
