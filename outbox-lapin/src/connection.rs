//! Opening connections and bounding broker calls: every await on the
//! broker has a time limit.

use crate::error::redact_url;
use crate::{AmqpUrls, Error, Result};

/// Runs one broker operation (`operation` names it in the error), bounded by
/// `limit`: every await on the broker goes through here or an equivalent
/// `tokio::time::timeout`, so a broker that keeps the connection alive but
/// does not answer can stall nothing for longer than `limit`.
pub(crate) async fn bounded<T>(
    operation: &str,
    limit: std::time::Duration,
    call: impl std::future::Future<Output = lapin::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(done) => done.map_err(Error::amqp(operation)),
        Err(_) => Err(Error::Timeout {
            operation: operation.to_owned(),
            after: limit,
        }),
    }
}

/// Opens a connection named `name` (shown in the management UI and
/// `rabbitmqctl list_connections client_properties`) to one of `urls`,
/// tried in turn from the last that worked (see [`AmqpUrls`]), each try
/// bounded by [`CONNECT_TIMEOUT`].
///
/// The node is remembered as working only by [`AmqpUrls::connect`] (a
/// handshake is all it needs) and by callers of [`connect_to_node`] once
/// their session is usable.
pub(crate) async fn connect(urls: &AmqpUrls, name: &str) -> Result<lapin::Connection> {
    let (connection, index) = connect_to_node(urls, name).await?;
    urls.worked(index);
    Ok(connection)
}

/// As [`connect`], with the index of the URL that answered, which is not
/// yet remembered: the caller calls [`AmqpUrls::worked`] once its session
/// is usable (channels open, declarations and subscriptions answered), or
/// [`AmqpUrls::failed`] when it is not, so that a node that completes the
/// handshake and then never answers does not keep its clients.
pub(crate) async fn connect_to_node(
    urls: &AmqpUrls,
    name: &str,
) -> Result<(lapin::Connection, usize)> {
    urls.check()?;
    let mut failures = Vec::new();
    for (index, url) in urls.in_turn() {
        match connect_one(url, name).await {
            Ok(connection) => {
                tracing::info!(
                    connection = name,
                    node = %redact_url(url),
                    "connected to RabbitMQ"
                );
                return Ok((connection, index));
            }
            Err(error) => {
                if urls.len() > 1 {
                    tracing::warn!(
                        connection = name,
                        node = %redact_url(url),
                        %error,
                        "RabbitMQ node not reachable; trying the next"
                    );
                }
                failures.push(error);
            }
        }
    }
    match failures.len() {
        1 => Err(failures.remove(0)),
        _ => Err(Error::Unreachable { failures }),
    }
}

/// One try at one URL, bounded by [`CONNECT_TIMEOUT`].
async fn connect_one(url: &str, name: &str) -> Result<lapin::Connection> {
    let properties = lapin::ConnectionProperties::default().with_connection_name(name.into());
    match tokio::time::timeout(CONNECT_TIMEOUT, lapin::Connection::connect(url, properties)).await {
        Ok(connected) => connected.map_err(|source| Error::Connect {
            url: redact_url(url),
            source,
        }),
        Err(_) => Err(Error::ConnectTimeout {
            url: redact_url(url),
            after: CONNECT_TIMEOUT,
        }),
    }
}

/// How long opening a connection may take before it fails with
/// [`Error::ConnectTimeout`] (and is retried like any lost connection):
/// without a bound, a broker that accepts TCP but never answers would hold
/// the publisher (and the relay behind it) or a consumer forever.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
