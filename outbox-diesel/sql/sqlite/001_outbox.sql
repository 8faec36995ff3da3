-- SQLite: the state PostgreSQL reaches after sql/001..005, in one
-- migration. Same tables, columns (in the same order), statuses, CHECKs,
-- index and trigger names; plus the lease of the SQLite claim
-- (`lease_token`, `lease_until`). The library creates its version table
-- (`outbox_schema_version`) itself.
--
-- No `{schema}` prefix: one database file is one outbox (SQLite's "schema"
-- would be an attached database, which is out of scope), so every name is
-- unqualified. A trigger may only name tables of its own database anyway.
--
-- Every statement is `IF NOT EXISTS` (or an upsert that does nothing the
-- second time): the file can run again on a migrated database. Migrate runs
-- it under the write lock (`BEGIN IMMEDIATE`); `PRAGMA journal_mode = WAL`
-- cannot run inside a transaction, so migrate sets it before, on its own.
--
-- Types (tables are STRICT, SQLite 3.37+: a value of the wrong type is an
-- error, not silently stored as whatever it is):
-- - timestamps: INTEGER microseconds since the Unix epoch, UTC, so that
--   `next_attempt_at <= ?`, `lease_until > ?` and the purges compare
--   numbers. The defaults (`now`, millisecond precision) are for other
--   writers; the library binds its own clock's times.
-- - uuids: TEXT, lowercase and hyphenated (`Uuid::to_string`), checked, so
--   that equal ids are equal texts, as with PostgreSQL's `uuid`.
-- - booleans: INTEGER 0/1, checked.
-- - JSON: TEXT checked with `json_valid` (see `payload`).
-- - aggregate keys: TEXT with the default BINARY collation: 'a', 'a ' and
--   'A' are three aggregates, as on PostgreSQL.
--
-- Not ported: autovacuum settings (SQLite has no dead tuples: a deleted
-- row's space is reused by later inserts) and CONCURRENTLY (one writer:
-- everything here takes the write lock briefly, on an empty file or on
-- tables that already exist).

-- step: transaction
CREATE TABLE IF NOT EXISTS outbox_events (
    -- AUTOINCREMENT: a seq is never handed out twice, even after the purge
    -- deleted the highest rows (a plain INTEGER PRIMARY KEY takes max+1, so
    -- it would reuse them). The relay's order, the admin's chunked walks
    -- (`seq > last`) and operators' references rely on seqs only growing.
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT    NOT NULL,
    aggregate_type    TEXT    NOT NULL,
    aggregate_id      TEXT    NOT NULL,
    aggregate_version INTEGER,
    event_type        TEXT    NOT NULL,
    schema_version    INTEGER NOT NULL,
    -- TEXT keeps the payload byte-exact (PostgreSQL's `json` does too).
    -- `json_valid` accepts what PostgreSQL's `json` accepts (duplicate keys,
    -- `\u0000`, lone surrogate escapes, 1e400, any whitespace) and refuses
    -- what it refuses (truncated text, trailing garbage, empty text, bad
    -- escapes, raw control characters; JSON5 too), with one difference:
    -- nesting deeper than 1,000 levels (SQLite's JSON_MAX_DEPTH, 2,000
    -- before 3.45) is refused, where PostgreSQL takes ~13,000.
    payload           TEXT    NOT NULL,
    headers           TEXT    NOT NULL DEFAULT '{}',
    occurred_at       INTEGER NOT NULL,
    status            TEXT    NOT NULL DEFAULT 'pending',
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   INTEGER,
    last_error        TEXT,
    published_at      INTEGER,
    unroutable_since  INTEGER,
    suspect_count     INTEGER NOT NULL DEFAULT 0,
    error_group       TEXT,
    finished_at       INTEGER,
    -- The lease of the SQLite claim (no row locks): the claim sets both in
    -- a short write transaction and commits before publishing; the marks
    -- are fenced by `lease_token = ?`; a lease whose `lease_until` has
    -- passed may be claimed again. NULL when no relay holds the row.
    lease_token       TEXT,
    lease_until       INTEGER,
    CONSTRAINT outbox_events_id_key UNIQUE (id),
    CONSTRAINT outbox_events_id_uuid CHECK (id GLOB
        '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'),
    CONSTRAINT outbox_events_status_check
        CHECK (status IN ('pending', 'retry', 'held', 'sent', 'dead', 'skipped')),
    -- What `record` already enforces, for other writers too (SQLite has no
    -- index entry limit, but the same keys must work on every back end).
    -- Bytes of the UTF-8 text (`octet_length` is SQLite 3.43+).
    CONSTRAINT outbox_events_key_lengths
        CHECK (length(CAST(aggregate_id AS BLOB)) <= 2048
               AND length(CAST(aggregate_type AS BLOB)) <= 255),
    CONSTRAINT outbox_events_payload_json CHECK (json_valid(payload)),
    CONSTRAINT outbox_events_headers_json CHECK (json_valid(headers))
) STRICT;

-- The same partial indexes as PostgreSQL (SQLite uses a partial index when
-- the query's WHERE contains the index's WHERE terms as written).
-- What the claim scans, in seq order: pending rows only.
CREATE INDEX IF NOT EXISTS outbox_events_pending
    ON outbox_events (seq) WHERE status = 'pending';
-- Retries, by when they are due.
CREATE INDEX IF NOT EXISTS outbox_events_retry_due
    ON outbox_events (next_attempt_at) WHERE status = 'retry';
-- Per-aggregate order: earlier events of an aggregate that hold it back.
CREATE INDEX IF NOT EXISTS outbox_events_blocking
    ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE status IN ('retry', 'dead');
-- Held rows by aggregate: the ordering probe and the release.
CREATE INDEX IF NOT EXISTS outbox_events_held
    ON outbox_events (aggregate_type, aggregate_id, seq) WHERE status = 'held';
-- Failed and skipped events in seq order: the admin's chunked walks.
CREATE INDEX IF NOT EXISTS outbox_events_failed
    ON outbox_events (seq) WHERE status IN ('retry', 'dead', 'skipped');
-- Leased rows by token: a dropped claim's best-effort release
-- (`UPDATE … WHERE lease_token = ?`) without a scan. Holds only the rows
-- of claims in flight.
CREATE INDEX IF NOT EXISTS outbox_events_leased
    ON outbox_events (lease_token) WHERE lease_token IS NOT NULL;

-- Held events go back to pending in the transaction that removes the retry
-- or dead event they waited behind, whoever removes it: a held event never
-- outlives what holds it. SQLite fires a row trigger right after each row
-- (PostgreSQL at the end of the statement); for a statement that frees
-- several blockers of one aggregate the trigger of the last of them sees
-- them all freed, so the held rows behind them are released all the same.
-- The UPDATE only sets `held` rows to `pending`, which the WHEN clause
-- ignores, so the trigger does not fire itself.
-- step: transaction
CREATE TRIGGER IF NOT EXISTS outbox_events_release_held
    AFTER UPDATE OF status ON outbox_events FOR EACH ROW
    WHEN OLD.status IN ('retry', 'dead') AND NEW.status NOT IN ('retry', 'dead')
BEGIN
    UPDATE outbox_events SET status = 'pending'
    WHERE aggregate_type = OLD.aggregate_type AND aggregate_id = OLD.aggregate_id
      AND seq > OLD.seq AND status = 'held'
      AND NOT EXISTS (
          SELECT 1 FROM outbox_events AS b
          WHERE b.aggregate_type = outbox_events.aggregate_type
            AND b.aggregate_id = outbox_events.aggregate_id
            AND b.seq < outbox_events.seq AND b.status IN ('retry', 'dead'));
END;
CREATE TRIGGER IF NOT EXISTS outbox_events_release_held_deleted
    AFTER DELETE ON outbox_events FOR EACH ROW
    WHEN OLD.status IN ('retry', 'dead')
BEGIN
    UPDATE outbox_events SET status = 'pending'
    WHERE aggregate_type = OLD.aggregate_type AND aggregate_id = OLD.aggregate_id
      AND seq > OLD.seq AND status = 'held'
      AND NOT EXISTS (
          SELECT 1 FROM outbox_events AS b
          WHERE b.aggregate_type = outbox_events.aggregate_type
            AND b.aggregate_id = outbox_events.aggregate_id
            AND b.seq < outbox_events.seq AND b.status IN ('retry', 'dead'));
END;

-- One row: settings every relay on this outbox obeys. WITHOUT ROWID, so
-- `singleton` is not an alias of the rowid (which would ignore DEFAULT 1
-- and number a second DEFAULT VALUES row 2).
-- step: transaction
CREATE TABLE IF NOT EXISTS outbox_settings (
    singleton      INTEGER PRIMARY KEY DEFAULT 1 CHECK (singleton = 1),
    delivery_order TEXT NOT NULL DEFAULT 'per_aggregate'
        CHECK (delivery_order IN ('per_aggregate', 'unordered'))
) STRICT, WITHOUT ROWID;
INSERT INTO outbox_settings (singleton) VALUES (1) ON CONFLICT DO NOTHING;

-- The inbox: the primary key is the dedup decision (WITHOUT ROWID: the
-- table is its primary key's b-tree, no second copy of the key).
-- step: transaction
CREATE TABLE IF NOT EXISTS inbox_events (
    consumer    TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    received_at INTEGER NOT NULL DEFAULT (
        CAST(strftime('%s', 'now') AS INTEGER) * 1000000
        + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) * 1000),
    PRIMARY KEY (consumer, event_id),
    CONSTRAINT inbox_events_event_id_uuid CHECK (event_id GLOB
        '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]')
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_events_received_at ON inbox_events (received_at);

-- The last failed attempts of each event (the relay keeps 20 per event).
-- A plain INTEGER PRIMARY KEY: ids are internal and only order an event's
-- attempts; a reused id (after the highest rows were deleted) is still
-- above every remaining one.
-- step: transaction
CREATE TABLE IF NOT EXISTS outbox_attempts (
    id        INTEGER PRIMARY KEY,
    event_seq INTEGER NOT NULL,
    at        INTEGER NOT NULL DEFAULT (
        CAST(strftime('%s', 'now') AS INTEGER) * 1000000
        + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) * 1000),
    relay     TEXT,
    outcome   TEXT    NOT NULL CHECK (outcome IN ('retry', 'dead', 'suspect')),
    error     TEXT    NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS outbox_attempts_event ON outbox_attempts (event_seq, id);

-- Every mutation an operator ran. AUTOINCREMENT: audit ids are shown to
-- operators and never reused.
CREATE TABLE IF NOT EXISTS outbox_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL DEFAULT (
        CAST(strftime('%s', 'now') AS INTEGER) * 1000000
        + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) * 1000),
    identity TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    target   TEXT    NOT NULL CHECK (json_valid(target)),
    count    INTEGER NOT NULL DEFAULT 0,
    -- Set when the run ends: `done`, or `failed: <why>`. NULL while it
    -- runs, and for ever if it was killed.
    finished_at INTEGER,
    outcome  TEXT
) STRICT;

-- Relays register here and heartbeat; an operator pauses one with `paused`.
CREATE TABLE IF NOT EXISTS outbox_relays (
    name                  TEXT    PRIMARY KEY,
    host                  TEXT    NOT NULL,
    pid                   INTEGER NOT NULL,
    version               TEXT    NOT NULL,
    started_at            INTEGER NOT NULL,
    heartbeat_at          INTEGER NOT NULL,
    heartbeat_interval_ms INTEGER NOT NULL,
    in_flight             INTEGER NOT NULL DEFAULT 0,
    paused                INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1))
) STRICT;

-- Consumers' dead letters (see sql/005_admin.sql). AUTOINCREMENT: ids are
-- shown to operators and never reused.
-- step: transaction
CREATE TABLE IF NOT EXISTS inbox_dead_letters (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer          TEXT    NOT NULL,
    queue             TEXT    NOT NULL,
    exchange          TEXT    NOT NULL,
    routing_key       TEXT    NOT NULL,
    event_id          TEXT CHECK (event_id GLOB
        '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'),
    message_id        TEXT,
    event_type        TEXT,
    attempts          INTEGER NOT NULL,
    reason            TEXT    NOT NULL,
    headers           TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    payload           TEXT    NOT NULL,
    payload_truncated INTEGER NOT NULL DEFAULT 0 CHECK (payload_truncated IN (0, 1)),
    dead_lettered_at  INTEGER NOT NULL DEFAULT (
        CAST(strftime('%s', 'now') AS INTEGER) * 1000000
        + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) * 1000),
    replayed_at       INTEGER,
    purged_at         INTEGER
) STRICT;
CREATE INDEX IF NOT EXISTS inbox_dead_letters_queue ON inbox_dead_letters (queue, id);
-- The id the consumer gives each dead letter (header
-- x-outbox-dead-letter-id); queries must spell the expression the same way
-- (`headers ->> '$."x-outbox-dead-letter-id"'`) for SQLite to use it.
CREATE INDEX IF NOT EXISTS inbox_dead_letters_letter_id
    ON inbox_dead_letters (headers ->> '$."x-outbox-dead-letter-id"');
-- Open records by event, for messages without that id.
CREATE INDEX IF NOT EXISTS inbox_dead_letters_open_event
    ON inbox_dead_letters (queue, event_id)
    WHERE replayed_at IS NULL AND purged_at IS NULL;
