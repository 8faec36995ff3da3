//! The PostgreSQL entry points of the crate root: recording in the
//! `public` outbox, connecting, pooling.

use crate::POOL_CONNECT_TIMEOUT;
#[allow(unused_imports)] // in intra-doc links
use crate::POOL_WAIT_TIMEOUT;
use crate::record::Outbox;
use crate::{Error, Result};
use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Pool;
use futures_util::FutureExt as _;
use outbox_core::DomainEvent;
use uuid::Uuid;

/// Records `event` in the transaction open on `conn`, in the `public` outbox.
/// Shorthand for [`Outbox::default().record(conn, event)`](Outbox::record).
///
/// # Errors
/// As [`Outbox::record`].
pub async fn record<E: DomainEvent + Sync>(
    conn: &mut AsyncPgConnection,
    event: &E,
) -> Result<Uuid> {
    Outbox::default().record(conn, event).await
}

/// Records `events` with one `INSERT` in the `public` outbox. Shorthand for
/// [`Outbox::record_all`].
///
/// # Errors
/// As [`Outbox::record`].
pub async fn record_all<E: DomainEvent + Sync>(
    conn: &mut AsyncPgConnection,
    events: &[E],
) -> Result<Vec<Uuid>> {
    Outbox::default().record_all(conn, events).await
}

/// Opens a direct connection, honouring `sslmode` and `sslrootcert` in
/// `url` (see [TLS](crate#tls)).
///
/// The hosts of the URL are tried one at a time, in order, each for at most
/// its `connect_timeout` (if the URL sets none, 5 s with several hosts, 10 s
/// with one) for the whole attempt
/// (TCP, TLS, startup, authentication, the read-write check): a host that
/// accepts the connection and never answers is given up for the next, and
/// this never waits longer than that limit times the number of hosts.
///
/// # Errors
/// [`Error::Tls`] if `url` asks for TLS this build cannot give (no
/// `postgres-tls` feature) or its TLS settings are unusable;
/// [`Error::Config`] if it cannot be read; [`Error::Connect`], naming the
/// (redacted) URL, if the server cannot be reached or refuses the
/// connection (a certificate that does not verify included).
pub async fn connect(url: &str) -> Result<AsyncPgConnection> {
    crate::connect::Connector::new(url)?
        .connect()
        .await
        .map_err(|source| Error::Connect {
            url: crate::error::redact_url(url),
            source,
        })
}

/// A deadpool pool of diesel-async connections to `url`, at most `max_size`.
/// Connections are opened lazily, on first use.
///
/// Getting a connection never waits forever: at most [`POOL_WAIT_TIMEOUT`]
/// for a free one (an exhausted pool, e.g. a leak or too small a size), and
/// at most [`POOL_CONNECT_TIMEOUT`] for a new one to open (a database that
/// does not answer; longer if the hosts of the URL need it: each host gets
/// its own limit, see [`connect`]). Both then fail with deadpool's timeout error, which the
/// relay and the inbox consumer treat as the database being unavailable.
/// Build your own `Pool` for other limits.
///
/// A connection handed out is not pinged first (diesel-async's
/// `RecyclingMethod::Fast`, not its default `Verified`): a connection whose
/// server side closed is still dropped and replaced (its client notices the
/// closed socket), and the `SELECT 1` that `Verified` runs on every checkout
/// would add a round trip to every claim and every request transaction
/// (measured: about 0.1 ms of the relay's commit-to-publish latency, see the
/// crate docs). A query on a connection that broke silently fails once with
/// [`Error::Database`]; the relay and the inbox consumer retry it.
///
/// Each connection honours `sslmode` and `sslrootcert` in `url` as
/// [`connect`] does (see [TLS](crate#tls)); the root certificate file is
/// read once, here.
///
/// # Errors
/// [`Error::Tls`] as [`connect`]; [`Error::Config`] if the pool cannot be
/// built.
pub fn pool(url: &str, max_size: usize) -> Result<Pool<AsyncPgConnection>> {
    let connector = std::sync::Arc::new(crate::connect::Connector::new(url)?);
    let fast = diesel_async::pooled_connection::RecyclingMethod::Fast;
    // The walk over the hosts ends on its own (each host bounded): the pool
    // waits for it, plus a second, so that its error (naming each host's
    // failure) is the one reported.
    let walk = connector.walk_limit() + std::time::Duration::from_secs(1);
    crate::pool_of(
        url,
        max_size,
        fast,
        POOL_CONNECT_TIMEOUT.max(walk),
        move || {
            let connector = std::sync::Arc::clone(&connector);
            async move { connector.connect().await }.boxed()
        },
    )
}
