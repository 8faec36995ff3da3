//! Publishing a batch in waves so that per-aggregate order survives mixed
//! outcomes.
//!
//! In ordered mode the k-th event of an aggregate in a batch goes out only
//! after its (k-1)-th was confirmed, while events of different aggregates are
//! pipelined together in one wave. A failed event blocks the rest of its
//! aggregate in this batch (they are released, spending no attempt). In
//! unordered mode every event is in the first wave.

use std::collections::{HashMap, VecDeque};

use crate::{DeliveryOrder, OutboxRecord};

#[derive(Debug)]
pub(crate) struct Waves {
    /// Per aggregate (or per event when unordered): indexes into the batch.
    queues: Vec<VecDeque<usize>>,
    /// Aggregate queue of each batch index.
    queue_of: Vec<usize>,
}

impl Waves {
    pub(crate) fn new(records: &[OutboxRecord], order: DeliveryOrder) -> Self {
        let mut queues: Vec<VecDeque<usize>> = Vec::new();
        let mut queue_of = Vec::with_capacity(records.len());
        match order {
            DeliveryOrder::Unordered => {
                queues.extend((0..records.len()).map(|i| VecDeque::from([i])));
                queue_of.extend(0..records.len());
            }
            DeliveryOrder::PerAggregate => {
                let mut by_key: HashMap<(&str, &str), usize> = HashMap::new();
                for (i, record) in records.iter().enumerate() {
                    let q = *by_key
                        .entry(record.envelope.aggregate_key())
                        .or_insert_with(|| {
                            queues.push(VecDeque::new());
                            queues.len() - 1
                        });
                    queues[q].push_back(i);
                    queue_of.push(q);
                }
            }
        }
        Waves { queues, queue_of }
    }

    /// The next wave: the head of every aggregate that is not blocked, in
    /// batch order of first appearance. Empty when everything was taken or blocked.
    pub(crate) fn next_wave(&mut self) -> Vec<usize> {
        self.queues
            .iter_mut()
            .filter_map(VecDeque::pop_front)
            .collect()
    }

    /// Holds back the remaining events of `index`'s aggregate.
    pub(crate) fn block(&mut self, index: usize) {
        if let Some(q) = self.queue_of.get(index) {
            self.queues[*q].clear();
        }
    }

    /// Drops every remaining event (they are released unpublished).
    pub(crate) fn block_all(&mut self) {
        self.queues.iter_mut().for_each(VecDeque::clear);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventEnvelope;

    fn batch(keys: &[&str]) -> Vec<OutboxRecord> {
        keys.iter()
            .enumerate()
            .map(|(i, key)| {
                let env = EventEnvelope {
                    id: uuid::Uuid::now_v7(),
                    aggregate_type: "order".into(),
                    aggregate_id: (*key).into(),
                    aggregate_version: None,
                    event_type: "order.placed".into(),
                    schema_version: 1,
                    payload: "{}".into(),
                    headers: Default::default(),
                    occurred_at: chrono::Utc::now(),
                };
                OutboxRecord::pending(i as i64, env)
            })
            .collect()
    }

    #[test]
    fn ordered_waves_take_one_event_per_aggregate() {
        let records = batch(&["a", "b", "a", "c", "a", "b"]);
        let mut waves = Waves::new(&records, DeliveryOrder::PerAggregate);
        assert_eq!(waves.next_wave(), [0, 1, 3]);
        assert_eq!(waves.next_wave(), [2, 5]);
        assert_eq!(waves.next_wave(), [4]);
        assert!(waves.next_wave().is_empty());
    }

    #[test]
    fn a_failure_blocks_only_its_aggregate() {
        let records = batch(&["a", "b", "a", "b", "a"]);
        let mut waves = Waves::new(&records, DeliveryOrder::PerAggregate);
        assert_eq!(waves.next_wave(), [0, 1]);
        waves.block(0);
        assert_eq!(waves.next_wave(), [3]);
        assert!(waves.next_wave().is_empty());
    }

    #[test]
    fn unordered_is_one_wave() {
        let records = batch(&["a", "a", "a", "b"]);
        let mut waves = Waves::new(&records, DeliveryOrder::Unordered);
        assert_eq!(waves.next_wave(), [0, 1, 2, 3]);
        waves.block(1);
        assert!(waves.next_wave().is_empty());
        let mut waves = Waves::new(&records, DeliveryOrder::PerAggregate);
        waves.block_all();
        assert!(waves.next_wave().is_empty());
    }
}
