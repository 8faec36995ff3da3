-- Expand: the `held` status and the indexes of the claim that skips
-- blocked aggregates; `unroutable_since` for events held as unroutable.
-- Nothing here rewrites the table or blocks writers for
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
        CHECK (status IN ('pending', 'retry', 'held', 'sent', 'dead', 'skipped')) NOT VALID,
    -- What `record` already enforces, for other writers too: longer keys
    -- would not fit the aggregate indexes (2,704 bytes an entry), so such a
    -- row could never be marked failed, held or dead. Not validated:
    -- existing rows are not rescanned for it.
    DROP CONSTRAINT IF EXISTS outbox_events_key_lengths,
    ADD CONSTRAINT outbox_events_key_lengths
        CHECK (octet_length(aggregate_id) <= 2048 AND octet_length(aggregate_type) <= 255)
        NOT VALID;

-- step: transaction
ALTER TABLE {schema}.outbox_events VALIDATE CONSTRAINT outbox_events_status_check;

-- Held events go back to pending in the transaction that removes the
-- retry or dead event they waited behind, whoever removes it (this
-- library's relays, replay and skip, a relay of an earlier version, an
-- operator's UPDATE or DELETE): a held event never outlives what holds it.
-- The WHEN clauses keep it off the path of ordinary sends.
-- step: transaction
CREATE OR REPLACE FUNCTION {schema}.outbox_release_held() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.outbox_events AS t SET status = 'pending'
    WHERE t.aggregate_type = OLD.aggregate_type AND t.aggregate_id = OLD.aggregate_id
      AND t.seq > OLD.seq AND t.status = 'held'
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.outbox_events AS b
          WHERE b.aggregate_type = t.aggregate_type AND b.aggregate_id = t.aggregate_id
            AND b.seq < t.seq AND b.status IN ('retry', 'dead'));
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_events_release_held ON {schema}.outbox_events;
CREATE TRIGGER outbox_events_release_held
    AFTER UPDATE OF status ON {schema}.outbox_events FOR EACH ROW
    WHEN (OLD.status IN ('retry', 'dead') AND NEW.status NOT IN ('retry', 'dead'))
    EXECUTE FUNCTION {schema}.outbox_release_held();
DROP TRIGGER IF EXISTS outbox_events_release_held_deleted ON {schema}.outbox_events;
CREATE TRIGGER outbox_events_release_held_deleted
    AFTER DELETE ON {schema}.outbox_events FOR EACH ROW
    WHEN (OLD.status IN ('retry', 'dead'))
    EXECUTE FUNCTION {schema}.outbox_release_held();

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
