//! Hands deliveries to the workers: each decoded and sent to the worker of
//! its aggregate (one aggregate's events stay in queue order), until
//! shutdown or a lost connection.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};

use futures_util::StreamExt;
use lapin::options::BasicCancelOptions;
use tokio::sync::mpsc;

use super::Settings;
use super::session::{Ended, Session};
use super::worker::Job;
use crate::wire;

/// Hands deliveries to the workers until shutdown or a lost connection.
pub(super) async fn consume<F: Future<Output = ()>>(
    settings: &Settings,
    mut session: Session,
    queues: &[mpsc::Sender<Job>],
    shutdown: &mut std::pin::Pin<&mut F>,
) -> Ended {
    loop {
        let next = tokio::select! {
            biased;
            () = shutdown.as_mut() => {
                // Stop taking deliveries; what is prefetched but not yet
                // handed out is requeued when the connection closes.
                let tag = session.consumer.tag();
                if let Err(error) = session.channel.basic_cancel(tag, BasicCancelOptions::default()).await {
                    tracing::warn!(consumer = %settings.name, %error, "cancelling the subscription");
                }
                return Ended::Shutdown(Box::new(session));
            }
            next = session.consumer.next() => next,
        };
        let delivery = match next {
            Some(Ok(delivery)) => delivery,
            Some(Err(error)) => return Ended::Lost(error.to_string()),
            None => {
                return Ended::Lost(
                    "the broker cancelled the subscription (queue deleted?)".to_owned(),
                );
            }
        };
        let decoded = wire::decode(
            &delivery.properties,
            delivery.routing_key.as_str(),
            &delivery.data,
        );
        let worker = match &decoded {
            Ok(event) => worker_for(&event.aggregate_type, &event.aggregate_id, queues.len()),
            Err(_) => usize::try_from(delivery.delivery_tag).unwrap_or(0) % queues.len(),
        };
        let job = Job {
            delivery,
            decoded,
            republisher: session.republisher.clone(),
        };
        let Some(queue) = queues.get(worker) else {
            continue;
        };
        if queue.send(job).await.is_err() {
            // Only when a worker died (a bug): its delivery is requeued when
            // the connection closes.
            return Ended::Lost("a consumer worker stopped".to_owned());
        }
    }
}

/// The worker for an aggregate: stable for the life of the process.
fn worker_for(aggregate_type: &str, aggregate_id: &str, workers: usize) -> usize {
    if workers <= 1 {
        return 0;
    }
    let mut hasher = DefaultHasher::new();
    aggregate_type.hash(&mut hasher);
    aggregate_id.hash(&mut hasher);
    let workers_u64 = u64::try_from(workers).unwrap_or(u64::MAX);
    usize::try_from(hasher.finish() % workers_u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aggregate_always_maps_to_the_same_worker() {
        for n in 1..8 {
            let first = worker_for("order", "o-1", n);
            assert!(first < n);
            assert_eq!(first, worker_for("order", "o-1", n));
        }
        let spread: std::collections::HashSet<usize> = (0..64)
            .map(|i| worker_for("order", &i.to_string(), 4))
            .collect();
        assert_eq!(spread.len(), 4, "aggregates spread over all workers");
    }
}
