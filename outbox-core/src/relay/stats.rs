//! The backlog gauges, read from the store's stats, and the store's
//! housekeeping, every stats interval.

use tracing::warn;

use super::Relay;
use super::metrics;
use crate::{OutboxStore, Publisher};

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    pub(super) async fn stats_loop(&self) {
        loop {
            match self.store.stats().await {
                Ok(stats) => {
                    ::metrics::gauge!(metrics::BACKLOG).set(stats.backlog as f64);
                    ::metrics::gauge!(metrics::OLDEST_UNSENT_AGE_SECONDS)
                        .set(stats.oldest_unsent_age.map_or(0.0, |d| d.as_secs_f64()));
                    ::metrics::gauge!(metrics::DEAD).set(stats.dead as f64);
                    ::metrics::gauge!(metrics::BLOCKED_AGGREGATES)
                        .set(stats.blocked_aggregates as f64);
                    ::metrics::gauge!(metrics::UNROUTABLE_EVENTS).set(stats.unroutable as f64);
                    ::metrics::gauge!(metrics::RELAYS_LIVE).set(stats.relays_live as f64);
                }
                Err(err) => {
                    ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                    warn!(error = %err, "outbox relay: reading outbox stats failed");
                }
            }
            if let Err(err) = self.store.maintain().await {
                ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                warn!(error = %err, "outbox relay: outbox housekeeping failed");
            }
            tokio::select! {
                () = tokio::time::sleep(self.stats_interval) => {}
                () = self.handle.shutdown_requested() => return,
            }
        }
    }
}
