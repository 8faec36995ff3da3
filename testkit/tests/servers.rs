//! Private servers take the settings they are started with.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use outbox_testkit::pg;
use outbox_testkit::servers::PrivatePostgres;

/// Whether the server at `url` runs with `name = value`.
async fn setting_is(url: &str, name: &str, value: &str) -> bool {
    let mut conn = pg::connect(url).await;
    pg::count(
        &mut conn,
        &format!(
            "SELECT count(*) AS n FROM pg_settings WHERE name = '{name}' AND setting = '{value}'"
        ),
    )
    .await
        == 1
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_cluster_runs_with_the_settings_it_was_started_with() {
    // `fsync` overrides the kit's own `fsync = off`; `autovacuum` initdb's
    // default (on).
    let pg = PrivatePostgres::start_with_settings(&[("fsync", "on"), ("autovacuum", "off")]);
    assert!(setting_is(&pg.url(), "fsync", "on").await);
    assert!(setting_is(&pg.url(), "autovacuum", "off").await);
    // A cluster started without them has the kit's and initdb's.
    let plain = PrivatePostgres::start();
    assert!(setting_is(&plain.url(), "fsync", "off").await);
    assert!(setting_is(&plain.url(), "autovacuum", "on").await);
    drop(plain);
    // And they hold across a crash restart.
    pg.crash_restart(Duration::from_millis(100));
    assert!(setting_is(&pg.url(), "fsync", "on").await);
    assert!(setting_is(&pg.url(), "autovacuum", "off").await);
}
