//! The backlog gauges, read from the store's stats, and the store's
//! housekeeping, every stats interval.

use tracing::warn;

use super::Relay;
use super::metric_names;
use crate::{OutboxStore, Publisher};

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    pub(super) async fn stats_loop(&self) {
        loop {
            match self.store.stats().await {
                Ok(stats) => {
                    ::metrics::gauge!(metric_names::BACKLOG).set(stats.backlog as f64);
                    ::metrics::gauge!(metric_names::OLDEST_UNSENT_AGE_SECONDS)
                        .set(stats.oldest_unsent_age.map_or(0.0, |d| d.as_secs_f64()));
                    ::metrics::gauge!(metric_names::DEAD).set(stats.dead as f64);
                    ::metrics::gauge!(metric_names::BLOCKED_AGGREGATES)
                        .set(stats.blocked_aggregates as f64);
                    ::metrics::gauge!(metric_names::UNROUTABLE_EVENTS).set(stats.unroutable as f64);
                    ::metrics::gauge!(metric_names::RELAYS_LIVE).set(stats.relays_live as f64);
                }
                Err(err) => {
                    ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                    warn!(error = %err, "outbox relay: reading outbox stats failed");
                }
            }
            if let Err(err) = self.store.maintain().await {
                ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                warn!(error = %err, "outbox relay: outbox housekeeping failed");
            }
            tokio::select! {
                () = tokio::time::sleep(self.settings.stats_interval) => {}
                () = self.handle.shutdown_requested() => return,
            }
        }
    }
}
