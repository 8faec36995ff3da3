//! The facade gives an application everything through one dependency.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use outbox::testing::{InMemoryStore, RecordingPublisher};
use outbox::{DomainEvent, EventStatus, Relay};
use outbox_tests::events::OrderPlaced;
use serde::Serialize;
use uuid::Uuid;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
#[serde(untagged)]
enum OrderEvent {
    Paid {
        #[aggregate_id]
        order_id: Uuid,
    },
    Cancelled {
        #[aggregate_id]
        order_id: Uuid,
        was_paid: bool,
    },
}

#[tokio::test]
async fn derived_events_flow_through_the_relay_in_order() {
    let store = InMemoryStore::new();
    let order_id = Uuid::now_v7();
    let placed = store
        .record(&OrderPlaced {
            order_id,
            total_cents: 500,
        })
        .unwrap();
    let paid = store.record(&OrderEvent::Paid { order_id }).unwrap();
    let cancelled = store
        .record(&OrderEvent::Cancelled {
            order_id,
            was_paid: true,
        })
        .unwrap();

    let publisher = RecordingPublisher::new();
    let relay = Relay::builder(store.clone(), publisher.clone())
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(3))
        .await
        .expect("relay publishes the three events");
    handle.shutdown();
    task.await.unwrap();

    let published = publisher.published();
    assert_eq!(
        published.iter().map(|e| e.id).collect::<Vec<_>>(),
        [placed, paid, cancelled]
    );
    let types: Vec<&str> = published.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["order.placed", "order.paid", "order.cancelled"]);
    assert!(
        published
            .iter()
            .all(|e| e.aggregate_id == order_id.to_string())
    );
    assert_eq!(
        published[2].payload,
        format!(r#"{{"order_id":"{order_id}","was_paid":true}}"#)
    );
    assert!(
        store
            .records()
            .iter()
            .all(|r| r.status == EventStatus::Sent)
    );
}
