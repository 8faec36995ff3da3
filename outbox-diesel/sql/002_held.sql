-- Expand: the `held` status and the indexes of the claim that skips
-- blocked aggregates; `unroutable_since` for events held as unroutable. Nothing here rewrites the table or blocks writers for
-- long: the constraint is swapped NOT VALID (a brief lock, bounded by
-- lock_timeout) and validated without blocking writes; the indexes are
-- built CONCURRENTLY, one statement at a time, outside a transaction.
-- Relays of earlier versions keep working on `outbox_events_unsent` until
-- the contract step (003) drops it.

-- step: transaction
ALTER TABLE {schema}.outbox_events
    ADD COLUMN IF NOT EXISTS unroutable_since timestamptz,
    DROP CONSTRAINT IF EXISTS outbox_events_status_check,
    ADD CONSTRAINT outbox_events_status_check
        CHECK (status IN ('pending', 'retry', 'held', 'sent', 'dead', 'skipped')) NOT VALID;

-- step: transaction
ALTER TABLE {schema}.outbox_events VALIDATE CONSTRAINT outbox_events_status_check;

-- What the claim scans, in seq order: pending rows only (held rows and
-- retries waiting for their time are not in it).
-- step: concurrently
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_pending
    ON {schema}.outbox_events (seq) WHERE status = 'pending';

-- Retries, by when they are due.
-- step: concurrently
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_retry_due
    ON {schema}.outbox_events (next_attempt_at) WHERE status = 'retry';

-- Held rows by aggregate: the ordering probe and the release.
-- step: concurrently
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_held
    ON {schema}.outbox_events (aggregate_type, aggregate_id, seq) WHERE status = 'held';
