INSERT INTO claim_bench.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, occurred_at)
VALUES (gen_random_uuid(), 'order', (random() * 1000)::int::text, 'order.placed', 1, '{"order_id": 1}', now());
