//! [`AmqpUrls`]: the broker's URLs, one per node of a RabbitMQ cluster (or
//! just one), and which of them to try first.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::redact_url;
use crate::{Error, Result};

/// The broker's AMQP URLs: one for a single node, one per node for a
/// RabbitMQ cluster. Every builder of this crate takes them as
/// `impl Into<AmqpUrls>`, so a single `&str` or `String` works as before.
///
/// From a string, a comma-separated list gives several URLs (each trimmed,
/// empty items dropped):
/// `"amqp://u:p@rabbit-1:5672/%2f, amqp://u:p@rabbit-2:5672/%2f"`. So a
/// URL read from an environment variable or a flag (e.g. `AMQP_URL`) may
/// name a whole cluster. A literal comma in a user name or password must
/// therefore be percent-encoded as `%2C` (as URLs require anyway for
/// reserved characters).
///
/// # Which node a connection goes to
/// Connecting tries the URLs in turn, each bounded by
/// [`CONNECT_TIMEOUT`](crate::CONNECT_TIMEOUT), **starting with the last one
/// that worked** (the first URL at the start) and going round the list
/// once. The last one that worked is where the node was up a moment ago:
/// after a lost connection caused by a network blip or a forced close it
/// is the right one to try again, and when its node has stopped it refuses
/// the TCP connection at once and the next URL is tried in the same
/// round. Clients therefore stay on one node until it fails rather than
/// hopping between nodes at every reconnect. (A node that accepts TCP but
/// never answers, frozen or overloaded, costs one `CONNECT_TIMEOUT` before
/// the next URL is tried; the one that then works is tried first from then
/// on.) The clones of one `AmqpUrls` share this
/// memory. When every URL fails, the error is
/// [`Error::Unreachable`] naming each URL (password redacted) with its
/// error, and the caller's usual reconnect backoff applies before the next
/// round. Each connection logs the node it went to (`tracing`, INFO).
///
/// `Debug` and `Display` redact passwords.
///
/// ```
/// use outbox_lapin::AmqpUrls;
///
/// let urls = AmqpUrls::from("amqp://guest:guest@rabbit-1:5672/%2f, amqp://guest:guest@rabbit-2:5672/%2f");
/// assert_eq!(urls.len(), 2);
/// assert_eq!(urls.to_string(), "amqp://guest:***@rabbit-1:5672/%2f, amqp://guest:***@rabbit-2:5672/%2f");
/// let one = AmqpUrls::from("amqp://127.0.0.1:5672/%2f");
/// assert_eq!(one.iter().collect::<Vec<_>>(), ["amqp://127.0.0.1:5672/%2f"]);
/// ```
#[derive(Clone)]
pub struct AmqpUrls {
    urls: Arc<[String]>,
    /// The index of the URL that worked last (where the next try starts).
    preferred: Arc<AtomicUsize>,
}

impl AmqpUrls {
    /// The URLs as given, none split (see the `From` impls for splitting a
    /// comma-separated string).
    pub fn new<I, S>(urls: I) -> AmqpUrls
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AmqpUrls {
            urls: urls
                .into_iter()
                .map(Into::into)
                .map(|url| url.trim().to_owned())
                .filter(|url| !url.is_empty())
                .collect(),
            preferred: Arc::default(),
        }
    }

    /// A comma-separated list split into its URLs, each trimmed.
    fn split(list: &str) -> AmqpUrls {
        AmqpUrls::new(list.split(','))
    }

    /// How many URLs there are.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Whether there are none (refused by every builder and by
    /// [`check`](Self::check)).
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// The URLs, in the order given (with their passwords: do not log them,
    /// use [`Display`](fmt::Display)).
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.urls.iter().map(String::as_str)
    }

    /// Ok when there is at least one URL.
    ///
    /// # Errors
    /// [`Error::NoUrls`] for an empty list.
    pub fn check(&self) -> Result<()> {
        if self.urls.is_empty() {
            return Err(Error::NoUrls);
        }
        Ok(())
    }

    /// Opens a connection named `name` (the client-provided name the
    /// management UI and `rabbitmqctl list_connections` show) to the first
    /// node that answers, tried as the type's docs say: for declaring a
    /// topology or a health check with the same URLs as the publisher and
    /// the consumer.
    ///
    /// # Errors
    /// [`Error::NoUrls`]; [`Error::Connect`] or [`Error::ConnectTimeout`]
    /// with a single URL, [`Error::Unreachable`] naming each with several.
    pub async fn connect(&self, name: &str) -> Result<lapin::Connection> {
        crate::connection::connect(self, name).await
    }

    /// The URLs in the order to try them now: from the last that worked,
    /// round the list once.
    pub(crate) fn in_turn(&self) -> impl Iterator<Item = (usize, &str)> {
        let n = self.urls.len();
        let start = self.preferred.load(Ordering::Relaxed) % n.max(1);
        (0..n).map(move |k| {
            let i = (start + k) % n;
            (i, self.urls[i].as_str())
        })
    }

    /// Remembers URL `index` as the one that worked last.
    pub(crate) fn worked(&self, index: usize) {
        self.preferred.store(index, Ordering::Relaxed);
    }
}

impl fmt::Display for AmqpUrls {
    /// The URLs, comma-separated, passwords redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, url) in self.urls.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&redact_url(url))?;
        }
        Ok(())
    }
}

impl fmt::Debug for AmqpUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.urls.iter().map(|url| redact_url(url)))
            .finish()
    }
}

impl From<&str> for AmqpUrls {
    /// Splits a comma-separated list (see the type's docs).
    fn from(list: &str) -> AmqpUrls {
        AmqpUrls::split(list)
    }
}

impl From<String> for AmqpUrls {
    /// Splits a comma-separated list (see the type's docs).
    fn from(list: String) -> AmqpUrls {
        AmqpUrls::split(&list)
    }
}

impl From<&String> for AmqpUrls {
    /// Splits a comma-separated list (see the type's docs).
    fn from(list: &String) -> AmqpUrls {
        AmqpUrls::split(list)
    }
}

impl From<Vec<String>> for AmqpUrls {
    /// One URL per item, not split.
    fn from(urls: Vec<String>) -> AmqpUrls {
        AmqpUrls::new(urls)
    }
}

impl From<&[&str]> for AmqpUrls {
    /// One URL per item, not split.
    fn from(urls: &[&str]) -> AmqpUrls {
        AmqpUrls::new(urls.iter().copied())
    }
}

impl<const N: usize> From<[&str; N]> for AmqpUrls {
    /// One URL per item, not split.
    fn from(urls: [&str; N]) -> AmqpUrls {
        AmqpUrls::new(urls)
    }
}

impl From<&AmqpUrls> for AmqpUrls {
    fn from(urls: &AmqpUrls) -> AmqpUrls {
        urls.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_list_splits_and_trims_and_a_single_url_stays_whole() {
        let urls = AmqpUrls::from(" amqp://a:1/%2f ,amqp://u:p%2Cq@b:2/%2f,, ");
        assert_eq!(
            urls.iter().collect::<Vec<_>>(),
            ["amqp://a:1/%2f", "amqp://u:p%2Cq@b:2/%2f"]
        );
        assert!(!format!("{urls:?}{urls}").contains("p%2Cq"));
        assert_eq!(AmqpUrls::from(String::from("amqp://x/%2f")).len(), 1);
        assert_eq!(
            AmqpUrls::from(["amqp://a", "amqp://b", "amqp://c"]).len(),
            3
        );
        assert_eq!(AmqpUrls::from(vec!["amqp://a,b".to_owned()]).len(), 1);
    }

    #[test]
    fn an_empty_list_is_a_typed_error() {
        for empty in [
            AmqpUrls::from(""),
            AmqpUrls::from(" , "),
            AmqpUrls::new(Vec::<String>::new()),
        ] {
            assert!(matches!(empty.check(), Err(Error::NoUrls)), "{empty:?}");
        }
        assert!(AmqpUrls::from("amqp://a").check().is_ok());
    }

    #[test]
    fn tries_start_at_the_last_url_that_worked_and_go_round_once() {
        let urls = AmqpUrls::from("amqp://a, amqp://b, amqp://c");
        let order = |urls: &AmqpUrls| urls.in_turn().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(order(&urls), [0, 1, 2]);
        urls.clone().worked(2);
        assert_eq!(order(&urls), [2, 0, 1], "clones share the memory");
        assert_eq!(AmqpUrls::from("").in_turn().count(), 0);
    }
}
