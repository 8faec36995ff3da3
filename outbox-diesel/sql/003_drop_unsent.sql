-- Contract: the index relays before 002 scanned. Apply it once no relay of
-- an earlier version runs on this outbox (`migrate_contract`); until then it
-- only costs recording one more index entry per event.

-- step: concurrently
DROP INDEX CONCURRENTLY IF EXISTS {schema}.outbox_events_unsent;
