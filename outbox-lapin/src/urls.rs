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
/// name a whole cluster. A comma starts a new URL only when what follows it
/// (spaces aside) begins with a scheme and `://` (`amqp://`, `amqps://`);
/// any other comma belongs to the URL before it, so a password with a raw
/// comma (`amqp://app:a,b@rabbit-1/%2f`, allowed in a URL's user info)
/// stays one URL. Only a password containing a comma followed by
/// something of the form `scheme://` (`,amqp://`, `,x://`) would be split:
/// write that comma `%2C`.
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
/// on.) A node counts as working only once the client's session on it is
/// usable (the publisher's confirm channel open and its exchange declared,
/// the consumer subscribed), not at the end of the AMQP handshake: when a
/// node completes the handshake and then does not answer (a minority node
/// in a network partition), or a call on its connection times out, the
/// next round starts at the URL after it. The clones of one `AmqpUrls`
/// share this memory. When every URL fails, the error is
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

    /// A comma-separated list split into its URLs, each trimmed: a comma
    /// starts a new URL only before `scheme://` (see the type's docs).
    fn split(list: &str) -> AmqpUrls {
        let mut urls: Vec<String> = Vec::new();
        for item in list.split(',') {
            match urls.last_mut() {
                Some(last) if !starts_a_url(item) => {
                    last.push(',');
                    last.push_str(item);
                }
                _ => urls.push(item.to_owned()),
            }
        }
        // Commas and spaces around the list's items (`a, b,`) are separators.
        AmqpUrls::new(
            urls.iter()
                .map(|url| url.trim_matches(|c: char| c == ',' || c.is_whitespace())),
        )
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
    /// the consumer. The node is remembered as working once its handshake
    /// completes (see [`preferred`](Self::preferred)); call
    /// [`failed`](Self::failed) if what you then do on the connection
    /// fails or does not answer.
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
        let start = self.preferred();
        (0..n).map(move |k| {
            let i = (start + k) % n;
            (i, self.urls[i].as_str())
        })
    }

    /// Remembers URL `index` as the one that worked last.
    pub(crate) fn worked(&self, index: usize) {
        self.preferred.store(index, Ordering::Relaxed);
    }

    /// The index (in [`iter`](Self::iter)'s order) of the URL the next
    /// connection tries first: the last that worked, or the one after a
    /// node that [`failed`](Self::failed).
    pub fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.urls.len().max(1)
    }

    /// Reports that what was done on URL `index` failed or did not answer
    /// after the connection was made (a channel, declaration or
    /// subscription not answered, a call timed out; or, for a health
    /// check, a probe cut by its own timeout while connecting there): the
    /// next round starts at the URL after it, unless another client has
    /// already moved the start elsewhere. The publisher and the consumer
    /// do this themselves; call it after [`connect`](Self::connect) when
    /// your use of the connection fails.
    pub fn failed(&self, index: usize) {
        let n = self.urls.len();
        if n > 1 {
            let _ = self.preferred.compare_exchange(
                index,
                (index + 1) % n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}

/// Whether `item` (spaces aside) begins with a URL scheme and `://`.
fn starts_a_url(item: &str) -> bool {
    item.trim_start()
        .split_once("://")
        .is_some_and(|(scheme, _)| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
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
    fn a_raw_comma_in_a_password_stays_in_its_url_and_out_of_the_output() {
        let one = AmqpUrls::from("amqp://app:se,cr,et@rabbit-1:5672/%2f");
        assert_eq!(
            one.iter().collect::<Vec<_>>(),
            ["amqp://app:se,cr,et@rabbit-1:5672/%2f"]
        );
        let list = AmqpUrls::from(
            " amqp://app:a,b@rabbit-1:5672/%2f ,  amqps://app:,c,@rabbit-2:5671/%2f,amqp://rabbit-3 ",
        );
        assert_eq!(
            list.iter().collect::<Vec<_>>(),
            [
                "amqp://app:a,b@rabbit-1:5672/%2f",
                "amqps://app:,c,@rabbit-2:5671/%2f",
                "amqp://rabbit-3"
            ]
        );
        let shown = format!("{list} {list:?} {one} {one:?}");
        for secret in ["se,", ",cr", "et@", "a,b", ",c,", ":a", ":,"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert_eq!(
            list.to_string(),
            "amqp://app:***@rabbit-1:5672/%2f, amqps://app:***@rabbit-2:5671/%2f, amqp://rabbit-3"
        );
        // A comma and spaces before the next URL, and a trailing comma.
        let spaced = AmqpUrls::from("amqp://a:p,q@n1/%2f ,\t amqp://n2/%2f ,");
        assert_eq!(
            spaced.iter().collect::<Vec<_>>(),
            ["amqp://a:p,q@n1/%2f", "amqp://n2/%2f"]
        );
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

    #[test]
    fn a_failed_session_moves_the_start_to_the_next_url() {
        let urls = AmqpUrls::from("amqp://a, amqp://b, amqp://c");
        let order = |urls: &AmqpUrls| urls.in_turn().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(urls.preferred(), 0);
        urls.failed(0);
        assert_eq!(urls.preferred(), 1);
        assert_eq!(order(&urls), [1, 2, 0]);
        urls.failed(0);
        assert_eq!(order(&urls), [1, 2, 0], "another client moved it already");
        urls.failed(1);
        urls.failed(2);
        assert_eq!(order(&urls), [0, 1, 2], "round the list");
        let one = AmqpUrls::from("amqp://a");
        one.failed(0);
        assert_eq!(order(&one), [0]);
    }
}
