-- Expand: what the admin API reads and writes, and autovacuum settings for
-- a table that works as a queue. New tables only, and storage parameters
-- (a SHARE UPDATE EXCLUSIVE lock, bounded by lock_timeout): relays of
-- earlier versions neither read nor notice them.

-- `error_group`: the last error with numbers and ids stripped
-- (outbox_core::admin::normalize_error), written with `last_error`, so that
-- failure groups are a GROUP BY over a handful of values rather than over
-- every raw error text. `finished_at`: when an operator skipped the event
-- (the purge keeps skipped events for the retention from then). Constant
-- (NULL) defaults: catalog changes, no rewrite.
-- step: transaction
ALTER TABLE {schema}.outbox_events
    ADD COLUMN IF NOT EXISTS error_group text,
    ADD COLUMN IF NOT EXISTS finished_at timestamptz;

-- The last failed attempts of each event (the relay keeps 20 per event):
-- when, which relay, what it ended with, why. Deleted with their event by
-- the purge; the janitor also sweeps those of events deleted when sent.
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}.outbox_attempts (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_seq bigint      NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    relay     text,
    outcome   text        NOT NULL CHECK (outcome IN ('retry', 'dead', 'suspect')),
    error     text        NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_attempts_event ON {schema}.outbox_attempts (event_seq, id);

-- Every mutation an operator ran (replay, skip, retry-now, purge, pause):
-- who, what, which selection, when, how many rows it changed (each chunk
-- adds its count in its own transaction) and how it ended.
CREATE TABLE IF NOT EXISTS {schema}.outbox_audit (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    identity text        NOT NULL,
    action   text        NOT NULL,
    target   jsonb       NOT NULL,
    count    bigint      NOT NULL DEFAULT 0,
    -- Set when the run ends: `done`, or `failed: <why>`. NULL while it runs,
    -- and for ever if it was killed: `count` then says how far it got.
    finished_at timestamptz,
    outcome  text
);

-- Relays register here and heartbeat every stats interval; an operator
-- pauses one by setting `paused`, which it reads at its next heartbeat.
CREATE TABLE IF NOT EXISTS {schema}.outbox_relays (
    name                  text        PRIMARY KEY,
    host                  text        NOT NULL,
    pid                   integer     NOT NULL,
    version               text        NOT NULL,
    started_at            timestamptz NOT NULL,
    heartbeat_at          timestamptz NOT NULL,
    heartbeat_interval_ms bigint      NOT NULL,
    in_flight             integer     NOT NULL DEFAULT 0,
    paused                boolean     NOT NULL DEFAULT false
);

-- Consumers' dead letters: the inbox consumer records each message it
-- dead-letters once the broker confirmed the copy in the dead-letter
-- exchange, so operators list and group them here without getting (and
-- reordering) messages in the queue. The queue holds the messages; this is
-- their index: a replay or purge of the queue marks the rows
-- (`replayed_at`, `purged_at`). `queue` is the queue the consumer read the
-- message from. Rows are kept until deleted by hand.
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}.inbox_dead_letters (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer          text        NOT NULL,
    queue             text        NOT NULL,
    exchange          text        NOT NULL,
    routing_key       text        NOT NULL,
    event_id          uuid,
    message_id        text,
    event_type        text,
    attempts          integer     NOT NULL,
    reason            text        NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}',
    payload           text        NOT NULL,
    payload_truncated boolean     NOT NULL DEFAULT false,
    dead_lettered_at  timestamptz NOT NULL DEFAULT now(),
    replayed_at       timestamptz,
    purged_at         timestamptz
);
CREATE INDEX IF NOT EXISTS inbox_dead_letters_queue ON {schema}.inbox_dead_letters (queue, id);
-- The id the consumer gives each dead letter (header x-outbox-dead-letter-id):
-- a replay marks exactly the records of the messages it moved.
CREATE INDEX IF NOT EXISTS inbox_dead_letters_letter_id
    ON {schema}.inbox_dead_letters ((headers ->> 'x-outbox-dead-letter-id'));
-- Messages without that id (dead-lettered by the broker itself: expired,
-- over a delivery limit) are marked by event, among the open records.
CREATE INDEX IF NOT EXISTS inbox_dead_letters_open_event
    ON {schema}.inbox_dead_letters (queue, event_id)
    WHERE replayed_at IS NULL AND purged_at IS NULL;

-- Autovacuum: every outbox row is inserted, updated once or twice and
-- deleted (when sent, or by the purge), so the table's dead tuples are
-- mostly in the small partial indexes the claim walks (`pending`,
-- `retry_due`, `blocking`, `held`). PostgreSQL's default waits for 20 % of
-- the table to be dead: with a million sent rows kept for a week, 200,000
-- dead index entries before a vacuum, each one read by every claim that
-- passes it. 1 % (plus 1,000) keeps the claim's indexes lean; analyze at
-- 2 % keeps the planner's view of the (small, fast-changing) unsent part
-- fresh, which the claim's plan for due retries depends on. The inbox is
-- insert-then-purge: vacuum after the purge's deletes, not at 20 %.
-- step: transaction
ALTER TABLE {schema}.outbox_events SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);
ALTER TABLE {schema}.inbox_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);

-- Failed and skipped events in seq order: what the admin's chunked replay,
-- skip and retry-now and its listings walk (the other partial indexes are
-- by aggregate or by due time). Empty while nothing fails.
-- step: concurrently
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_failed
    ON {schema}.outbox_events (seq) WHERE status IN ('retry', 'dead', 'skipped');
