//! [`BrokerCleanup`]: deletes a test's exchanges and queues on drop, over
//! a connection of its own.

use std::sync::Mutex;

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};

use crate::{teardown, urls};

/// The exchanges and queues of one test, deleted when it is dropped (also
/// when the test panics), with a connection opened only then: for code
/// that declares them over connections of its own, which a test may break
/// (a broker restarted, a node frozen). [`TestBroker`](super::TestBroker) holds one.
pub struct BrokerCleanup {
    url: String,
    name: String,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
}

impl std::fmt::Debug for BrokerCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerCleanup")
            .field("url", &urls::redact(&self.url))
            .field("name", &self.name)
            .field("queues", &self.queues)
            .field("exchanges", &self.exchanges)
            .finish()
    }
}

impl BrokerCleanup {
    /// Nothing to delete yet on the broker at `url`; `name` names the
    /// teardown's connection (`<name>.teardown`) and its messages.
    pub fn new(url: &str, name: &str) -> BrokerCleanup {
        BrokerCleanup {
            url: url.to_owned(),
            name: name.to_owned(),
            queues: Mutex::default(),
            exchanges: Mutex::default(),
        }
    }

    /// Deletes queue `name` on drop.
    pub fn queue(&self, name: impl Into<String>) {
        if let Ok(mut queues) = self.queues.lock() {
            queues.push(name.into());
        }
    }

    /// Deletes exchange `name` on drop.
    pub fn exchange(&self, name: impl Into<String>) {
        if let Ok(mut exchanges) = self.exchanges.lock() {
            exchanges.push(name.into());
        }
    }
}

impl Drop for BrokerCleanup {
    fn drop(&mut self) {
        let queues = self.queues.lock().map(|q| q.clone()).unwrap_or_default();
        let exchanges = self.exchanges.lock().map(|e| e.clone()).unwrap_or_default();
        if queues.is_empty() && exchanges.is_empty() {
            return;
        }
        let url = self.url.clone();
        let name = self.name.clone();
        // A connection of its own: the test's may be the one it broke
        // (closed by the broker, or its runtime is gone).
        teardown::run(&format!("broker objects of {name}"), async move {
            let Ok(connection) = super::connect_any(&url, &format!("{name}.teardown")).await else {
                teardown::warn(&format!(
                    "{name}: broker unreachable, {queues:?} and {exchanges:?} left behind"
                ));
                return;
            };
            if let Ok(channel) = connection.create_channel().await {
                for queue in &queues {
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                for exchange in &exchanges {
                    let _ = channel
                        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
            }
            let _ = connection.close(200, "teardown".into()).await;
        });
    }
}
