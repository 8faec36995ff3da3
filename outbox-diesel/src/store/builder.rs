//! [`PgOutboxStoreBuilder`]: a [`PgOutboxStore`]'s settings, their defaults
//! and their validation.

use std::sync::Arc;
use std::time::Duration;

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Pool;

use super::PgOutboxStore;
use super::listen::Liveness;
use crate::schema::Schema;
use crate::sql::{Sql, StoreSql};
use crate::{Error, Result};

/// Settings of a [`PgOutboxStore`].
///
/// | setting | default |
/// |---|---|
/// | [`schema`](Self::schema) | `public` |
/// | [`listen`](Self::listen) | off (polling and in-process wakeups only) |
/// | [`listen_check`](Self::listen_check) | after 15 s of silence, a `SHOW transaction_read_only` answered `off` within 5 s |
/// | [`claim_timeout`](Self::claim_timeout) | 60 s |
/// | [`claim_window`](Self::claim_window) | 4 (× batch size) |
/// | [`keep_sent`](Self::keep_sent) | yes |
#[must_use]
pub struct PgOutboxStoreBuilder {
    pool: Pool<AsyncPgConnection>,
    schema: String,
    listen_url: Option<String>,
    liveness: Liveness,
    claim_timeout: Duration,
    claim_window: usize,
    keep_sent: bool,
    prepare: bool,
    /// The rendered SQL of the settings this builder came from, reused when
    /// the schema stays theirs.
    sql: Option<Arc<Sql>>,
}

impl std::fmt::Debug for PgOutboxStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOutboxStoreBuilder")
            .field("schema", &self.schema)
            .field(
                "listen_url",
                &self.listen_url.as_deref().map(crate::error::redact_url),
            )
            .field("claim_timeout", &self.claim_timeout)
            .field("claim_window", &self.claim_window)
            .finish_non_exhaustive()
    }
}

impl PgOutboxStoreBuilder {
    /// The schema holding `outbox_events` (default `public`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The schema and rendered SQL of [`PgSettings`](crate::PgSettings).
    pub(crate) fn with_sql(mut self, sql: Arc<Sql>) -> Self {
        self.schema = sql.schema.name().to_owned();
        self.sql = Some(sql);
        self
    }

    /// Wakes the relay on `NOTIFY` through a `LISTEN` on a **direct**
    /// connection to `url` (not through PgBouncer in transaction pooling,
    /// where `LISTEN` does not work). After that connection drops and
    /// returns, the relay rescans the whole backlog, since notifications sent
    /// meanwhile are lost. The connection belongs to the stream of
    /// [`OutboxStore::wakeups`](outbox_core::OutboxStore::wakeups), opened
    /// when a relay starts and closed when it stops (drops the stream).
    pub fn listen(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
        self
    }

    /// How the `LISTEN` connection of [`listen`](Self::listen) is checked:
    /// after `every` without a notification, a `SHOW transaction_read_only`
    /// that must answer `off` within `timeout`; if it fails, answers `on` or
    /// does not answer, the connection is dropped with a warning (the relay
    /// runs on polling alone until it is back) and opened again, after
    /// which the relay rescans the backlog. This catches a half-open socket
    /// (the primary gone in a failover without closing it, a network
    /// partition), on which no notification and no error would ever come,
    /// and an old primary fenced read-only, where no event is recorded any
    /// more. Default: every 15 s, within 5 s.
    pub fn listen_check(mut self, every: Duration, timeout: Duration) -> Self {
        self.liveness = Liveness { every, timeout };
        self
    }

    /// How long a claimed batch may stay in flight before PostgreSQL ends
    /// the claiming session and releases its rows (its
    /// `idle_in_transaction_session_timeout`). A claim is valid for 80 % of
    /// it ([`Claim::valid_until`]): the relay publishes nothing of a batch
    /// after that, and passes it to the publisher, whose confirm wait is the
    /// shorter of its confirm timeout and the time left. Default 60 s.
    ///
    /// [`Claim::valid_until`]: outbox_core::Claim::valid_until
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout;
        self
    }

    /// How many rows, as a multiple of the batch size, an ordered claim looks
    /// at to find claimable aggregates. The window must hold the rows other
    /// claims have in flight plus a batch: raise it when more than two relay
    /// loops share one outbox (a relay runs two by default). Default 4: a
    /// larger window costs every claim a candidate probe per extra row
    /// (measured: 10 was slower than 2–4 in the W2 drain).
    pub fn claim_window(mut self, factor: usize) -> Self {
        self.claim_window = factor;
        self
    }

    /// Whether published events stay in `outbox_events` as `sent` (default,
    /// for audit and replay; remove them with `purge_sent`) or are deleted
    /// as they are confirmed. Deleting writes no new row version and no
    /// index entries per event, which measurably raises relay throughput
    /// (see the crate docs); it also means `purge_sent` has nothing to do.
    pub fn keep_sent(mut self, keep: bool) -> Self {
        self.keep_sent = keep;
        self
    }

    /// Whether the store's statements (claim, mark, stats) stay prepared on
    /// each connection (default on: one round trip per statement instead of
    /// two, which is about a third of a claim's latency; see the crate docs).
    /// Turn it off behind PgBouncer in transaction pooling mode older than
    /// 1.21 (or without `max_prepared_statements`).
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepare = on;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid schema name, a claim timeout under
    /// one second, a claim window of 0, or a `LISTEN` check interval or
    /// timeout of zero.
    pub fn build(self) -> Result<PgOutboxStore> {
        let schema = Schema::new(&self.schema)?;
        if self.liveness.every.is_zero() || self.liveness.timeout.is_zero() {
            return Err(Error::Config(
                "listen_check needs an interval and a timeout above zero".into(),
            ));
        }
        if self.claim_timeout < Duration::from_secs(1) {
            return Err(Error::Config("claim_timeout must be at least 1 s".into()));
        }
        if self.claim_window == 0 {
            return Err(Error::Config("claim_window must be at least 1".into()));
        }
        let shared = match self.sql {
            Some(sql) if sql.schema == schema => sql,
            _ => Sql::for_schema(&schema),
        };
        Ok(PgOutboxStore {
            pool: self.pool,
            sql: Arc::new(StoreSql::postgres(&schema, self.keep_sent)),
            shared,
            prepare: self.prepare,
            schema,
            listen_url: self.listen_url,
            liveness: self.liveness,
            claim_timeout: self.claim_timeout,
            claim_window: self.claim_window,
            order_cache: Arc::default(),
            blocking_cache: Arc::default(),
            version_ok: Arc::default(),
            relay: Arc::default(),
        })
    }
}

impl PgOutboxStore {
    /// Starts configuring a store on `pool`.
    pub fn builder(pool: Pool<AsyncPgConnection>) -> PgOutboxStoreBuilder {
        PgOutboxStoreBuilder {
            pool,
            schema: "public".into(),
            listen_url: None,
            liveness: Liveness::default(),
            claim_timeout: Duration::from_secs(60),
            claim_window: 4,
            keep_sent: true,
            prepare: true,
            sql: None,
        }
    }
}
