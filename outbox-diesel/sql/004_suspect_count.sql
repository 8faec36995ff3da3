-- Expand: `suspect_count`, how often the broker connection died while the
-- event was in flight (the relay publishes such an event alone and parks it
-- `dead` at its `suspect_limit`). A constant default makes this a catalog
-- change: no table rewrite, a brief lock bounded by lock_timeout. Relays of
-- earlier versions do not read it.

-- step: transaction
ALTER TABLE {schema}.outbox_events
    ADD COLUMN IF NOT EXISTS suspect_count integer NOT NULL DEFAULT 0;
