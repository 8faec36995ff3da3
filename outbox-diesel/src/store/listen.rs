//! `LISTEN` wakeups on a direct connection, with reconnects.

use std::pin::pin;
use std::time::Duration;

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::StreamExt;
use outbox_core::{Backoff, RelayHandle};

use crate::schema::Schema;
use crate::{Error, Result};

/// Listens until the relay stops, reconnecting with backoff. After every
/// (re)connect the relay is woken once, so it rescans the backlog for events
/// whose notifications were sent while nobody listened.
pub(crate) async fn run(url: &str, schema: &Schema, relay: &RelayHandle) {
    // Jittered: after a database restart, relays reconnect spread out.
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let mut listened = false;
        let result = listen_once(url, schema, relay, &mut listened).await;
        if listened {
            // The connection worked: a later drop starts the backoff afresh.
            backoff.reset();
        }
        let retry_in = backoff.next_delay();
        match result {
            Ok(()) => tracing::warn!(
                schema = schema.name(),
                ?retry_in,
                "outbox LISTEN connection closed; reconnecting"
            ),
            Err(err) => tracing::warn!(
                schema = schema.name(),
                error = %err,
                ?retry_in,
                "outbox LISTEN connection failed; relying on polling until it is back"
            ),
        }
        tokio::time::sleep(retry_in).await;
    }
}

async fn listen_once(
    url: &str,
    schema: &Schema,
    relay: &RelayHandle,
    listened: &mut bool,
) -> Result<()> {
    let mut conn: AsyncPgConnection = crate::connect(url).await?;
    let name = format!("outbox_listener:{}", schema.name());
    diesel::sql_query("SELECT set_config('application_name', $1, false)")
        .bind::<diesel::sql_types::Text, _>(name)
        .execute(&mut conn)
        .await?;
    diesel::sql_query(format!("LISTEN {}", schema.quoted_channel()))
        .execute(&mut conn)
        .await?;
    tracing::debug!(schema = schema.name(), "outbox LISTEN connected");
    *listened = true;
    relay.notify();
    let mut notifications = pin!(conn.notifications_stream());
    while let Some(notification) = notifications.next().await {
        notification.map_err(Error::Database)?;
        relay.notify();
    }
    Ok(())
}
