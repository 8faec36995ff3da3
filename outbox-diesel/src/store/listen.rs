//! `LISTEN` wakeups on a direct connection, with reconnects and a liveness
//! check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::{Stream, StreamExt};
use outbox_core::Backoff;

use crate::sql::Sql;
use crate::{Error, Result};

/// How the `LISTEN` connection is checked: after `every` without a
/// notification, a `SHOW transaction_read_only` that must answer `off`
/// within `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Liveness {
    /// Silence after which the connection is checked.
    pub(crate) every: Duration,
    /// How long the check may take.
    pub(crate) timeout: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            every: Duration::from_secs(15),
            timeout: Duration::from_secs(5),
        }
    }
}

/// The store's wakeups: an item after every (re)connect, so the relay rescans
/// the backlog for events whose notifications were sent while nobody
/// listened, and one per notification. Reconnects with backoff, forever; the
/// stream owns the connection, so dropping it closes the `LISTEN` session.
///
/// A connection silent for `liveness.every` is checked with a
/// `SHOW transaction_read_only`: after a failover (the primary gone without
/// closing its sockets, a network partition) the socket may be half-open,
/// so no notification and no error would ever come, and the relay would
/// run on polling alone without a word; and an old primary fenced
/// read-only (or demoted) still answers, but no event is recorded there any
/// more, so its notifications never come. A check that fails, answers `on`
/// or does not answer within `liveness.timeout` drops the connection with
/// a warning and reconnects (to the new primary, with
/// `target_session_attrs=read-write`).
pub(crate) fn wakeups(
    url: String,
    sql: Arc<Sql>,
    liveness: Liveness,
) -> impl Stream<Item = ()> + Send + 'static {
    let listener = Listener {
        url,
        sql,
        liveness,
        // Jittered: after a database restart, relays reconnect spread out.
        backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
        conn: None,
        connected_at: None,
    };
    futures_util::stream::unfold(listener, |mut listener| async move {
        listener.next().await;
        Some(((), listener))
    })
}

/// The answer of the liveness check.
#[derive(diesel::QueryableByName)]
struct ReadOnly {
    #[diesel(sql_type = diesel::sql_types::Text)]
    transaction_read_only: String,
}

/// The state of [`wakeups`]: the `LISTEN` connection, if there is one.
struct Listener {
    url: String,
    /// The schema's SQL (its `LISTEN` statements, and its name for logs).
    sql: Arc<Sql>,
    liveness: Liveness,
    backoff: Backoff,
    conn: Option<AsyncPgConnection>,
    /// When the current (or last) connection was made.
    connected_at: Option<Instant>,
}

/// How long a `LISTEN` connection must last before its loss starts the
/// backoff afresh: a server (or a pooler) that accepts connections and drops
/// them at once must not be reconnected to every 100 ms forever.
const STABLE_AFTER: Duration = Duration::from_secs(30);

impl Listener {
    /// Waits for the next wakeup: a (re)connect or a notification.
    async fn next(&mut self) {
        loop {
            let Some(conn) = &mut self.conn else {
                match listen(&self.url, &self.sql).await {
                    Ok(conn) => {
                        tracing::debug!(schema = self.sql.schema.name(), "outbox LISTEN connected");
                        self.connected_at = Some(Instant::now());
                        self.conn = Some(conn);
                        return;
                    }
                    Err(err) => self.retry(Err(err)).await,
                }
                continue;
            };
            // Each call takes the next notification from the connection's
            // queue (a channel: waiting is cancel-safe), so a fresh stream
            // per item loses none.
            let notification = {
                let mut stream = std::pin::pin!(conn.notifications_stream());
                tokio::time::timeout(self.liveness.every, stream.next()).await
            };
            match notification {
                Ok(Some(Ok(_))) => return,
                Ok(Some(Err(err))) => {
                    self.conn = None;
                    self.retry(Err(Error::Database(err))).await;
                }
                Ok(None) => {
                    self.conn = None;
                    self.retry(Ok(())).await;
                }
                Err(_silent) => {
                    let check = diesel::sql_query("SHOW transaction_read_only")
                        .get_result::<ReadOnly>(conn);
                    let failure = match tokio::time::timeout(self.liveness.timeout, check).await {
                        Ok(Ok(answer)) if answer.transaction_read_only != "on" => continue,
                        Ok(Ok(_)) => "the server is read-only (a standby, or an old primary \
                                      fenced after a failover): no event is recorded there"
                            .to_owned(),
                        Ok(Err(err)) => Error::Database(err).to_string(),
                        Err(_) => format!("no answer within {:?}", self.liveness.timeout),
                    };
                    self.conn = None;
                    self.dead(&failure).await;
                }
            }
        }
    }

    /// The connection failed its liveness check (already dropped): says so
    /// and reconnects without waiting, since a server that answers may be
    /// there (the promoted standby after a failover).
    async fn dead(&mut self, failure: &str) {
        tracing::warn!(
            schema = self.sql.schema.name(),
            failure,
            "outbox LISTEN connection failed its liveness check (SHOW transaction_read_only); \
             relying on polling only until it is reconnected"
        );
        // As after any loss: a connection that lasted starts the backoff
        // afresh, so the first reconnect is at once only for those.
        if lasted(self.connected_at.take()) {
            self.backoff.reset();
        }
    }

    /// Logs why there is no connection and sleeps before the next attempt.
    async fn retry(&mut self, result: Result<()>) {
        // A connection that lasted starts the backoff afresh; one dropped
        // soon after it was made keeps backing off.
        if lasted(self.connected_at.take()) {
            self.backoff.reset();
        }
        let retry_in = self.backoff.next_delay();
        match result {
            Ok(()) => tracing::warn!(
                schema = self.sql.schema.name(),
                ?retry_in,
                "outbox LISTEN connection closed; reconnecting"
            ),
            Err(err) => tracing::warn!(
                schema = self.sql.schema.name(),
                error = %err,
                ?retry_in,
                "outbox LISTEN connection failed; relying on polling until it is back"
            ),
        }
        tokio::time::sleep(retry_in).await;
    }
}

/// Whether a connection made at `connected_at` (if any) lasted long enough
/// for its loss to start the backoff afresh.
fn lasted(connected_at: Option<Instant>) -> bool {
    connected_at.is_some_and(|at| at.elapsed() >= STABLE_AFTER)
}

/// Connects, names the session `outbox_listener:<schema>` and `LISTEN`s on
/// the schema's channel.
async fn listen(url: &str, sql: &Sql) -> Result<AsyncPgConnection> {
    let mut conn: AsyncPgConnection = crate::connect(url).await?;
    diesel::sql_query(&sql.listen.set_application_name)
        .bind::<diesel::sql_types::Text, _>(&sql.listen.application_name)
        .execute(&mut conn)
        .await?;
    diesel::sql_query(&sql.listen.listen)
        .execute(&mut conn)
        .await?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_that_lasted_resets_the_backoff() {
        assert!(!lasted(None), "no connection: keep backing off");
        assert!(!lasted(Some(Instant::now())), "dropped at once");
        let long_ago = Instant::now()
            .checked_sub(STABLE_AFTER + Duration::from_secs(1))
            .expect("the clock is past boot + 31 s");
        assert!(lasted(Some(long_ago)));
    }
}
