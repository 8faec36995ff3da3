-- The outbox on MariaDB 10.6+ (tested on 10.11): the state PostgreSQL
-- reaches after sql/001..005, in one migration. Same tables, columns,
-- status values and CHECKs; what differs is said where it differs.
--
-- `{schema}` renders as "`db`." (with its dot) or as "" (the connection's
-- database), so it is written right before each table name, without a dot.
--
-- DDL is not transactional on MariaDB (each statement commits), so every
-- step is idempotent: a migration killed half-way is re-run from its first
-- step. Each table is ONE `CREATE TABLE IF NOT EXISTS` with its indexes and
-- CHECKs inline: on 10.6+ a CREATE TABLE is atomic (crash-safe DDL), so a
-- table exists whole or not at all. The migrator takes GET_LOCK and creates
-- `outbox_schema_version` itself.
--
-- Every table: ENGINE=InnoDB (row locks, SKIP LOCKED, crash safety) and
-- DEFAULT CHARSET utf8mb4 COLLATE utf8mb4_nopad_bin, so that every text
-- column compares like PostgreSQL `text` under `=`: byte for byte, case
-- and trailing spaces significant ('a', 'a ' and 'A' are three consumers,
-- relays, queues or aggregates). The PAD SPACE collations (utf8mb4_bin,
-- the server default utf8mb4_general_ci) would merge 'a' and 'a ' in
-- unique keys and lookups. Sorting is by code point (PostgreSQL's sorts by
-- its collation): no statement depends on a text order.
--
-- Types: uuid -> CHAR(36) ascii_bin (lower-case hyphenated text, as Rust's
-- Uuid prints it); timestamptz -> DATETIME(6) in UTC (the session sets
-- time_zone '+00:00'; TIMESTAMP would end in 2038); json/jsonb -> LONGTEXT
-- (MariaDB's JSON type is only an alias of LONGTEXT with a JSON_VALID
-- CHECK; MySQL's re-serialises the text); boolean -> BOOLEAN (TINYINT(1));
-- identity -> AUTO_INCREMENT. Short AMQP strings (aggregate and event types,
-- queue, exchange, routing key, consumer, relay names; at most 255 bytes on
-- the wire) are VARCHAR(255); longer free text is TEXT/MEDIUMTEXT/LONGTEXT.
--
-- No trigger: PostgreSQL's `outbox_release_held` (002) updates the table it
-- fires on, which MariaDB forbids (error 1442). The store releases held
-- events explicitly (see docs/design/mysql-statements.md), and maintain()'s
-- orphan release repairs manual edits.

-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}outbox_events (
    seq               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id                CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_type    VARCHAR(255)  NOT NULL,
    aggregate_id      VARCHAR(2048) NOT NULL,
    -- What the indexes hold in place of the aggregate: a 2,048-byte id (up
    -- to 8 KiB in utf8mb4) exceeds InnoDB's 3,072-byte key. NUL separates
    -- type and id unambiguously (validate() refuses NUL in both). Queries
    -- seek by the hash and compare the full columns too, so a collision
    -- costs a probe, never correctness.
    aggregate_key     BINARY(32) AS
        (UNHEX(SHA2(CONCAT(aggregate_type, CHAR(0), aggregate_id), 256))) STORED,
    aggregate_version BIGINT,
    event_type        VARCHAR(255) NOT NULL,
    schema_version    INT          NOT NULL,
    -- The payload text as given, byte-exact (utf8mb4_bin: no folding, no
    -- re-serialisation). No CHECK (JSON_VALID(payload)): on 10.11
    -- JSON_VALID refuses JSON that PostgreSQL's `json` stores (nesting of
    -- 32 levels or more, so even a typed event 100 objects deep; lone
    -- surrogate escapes such as "\ud800") and accepts text PostgreSQL
    -- refuses (unknown escapes such as "\x", "\q"); it accepts 1e400,
    -- duplicate keys and "\u0000" like PostgreSQL. Neither sound nor
    -- complete, so the recorder validates in Rust instead (see
    -- docs/design/mysql-statements.md). Rows are limited by the server's
    -- max_allowed_packet (16 MiB by default on 10.11), not by the column.
    payload           LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- A JSON object of strings, written by the library (serde_json).
    headers           LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
        DEFAULT '{}' CHECK (JSON_VALID(headers)),
    occurred_at       DATETIME(6)  NOT NULL,
    status            VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL
        DEFAULT 'pending',
    attempts          INT          NOT NULL DEFAULT 0,
    next_attempt_at   DATETIME(6),
    last_error        MEDIUMTEXT,
    published_at      DATETIME(6),
    unroutable_since  DATETIME(6),
    suspect_count     INT          NOT NULL DEFAULT 0,
    error_group       MEDIUMTEXT,
    finished_at       DATETIME(6),
    CONSTRAINT outbox_events_status_check
        CHECK (status IN ('pending', 'retry', 'held', 'sent', 'dead', 'skipped')),
    CONSTRAINT outbox_events_key_lengths
        CHECK (OCTET_LENGTH(aggregate_id) <= 2048 AND OCTET_LENGTH(aggregate_type) <= 255),
    CONSTRAINT outbox_events_id_key UNIQUE KEY (id),
    -- No partial indexes on MariaDB: each of PostgreSQL's is a composite
    -- index with the status first, so that `status = X` (or a short IN
    -- list) seeks to the same small range the partial index held, however
    -- many sent rows the table keeps. (InnoDB appends the primary key `seq`
    -- to every secondary index entry anyway.) The statements name these
    -- indexes in FORCE INDEX hints (docs/design/mysql-statements.md): a
    -- rename must rename them there too.
    --
    -- outbox_events_pending (status = 'pending', seq), also
    -- outbox_events_failed (status IN ('retry','dead','skipped'), seq):
    -- the claim window's pending part (status = 'pending' ORDER BY seq
    -- LIMIT ?), the admin's chunked replay/skip/retry-now and listings
    -- (status IN (...) AND seq > ? ORDER BY seq), stats' counts per status,
    -- the purge (status IN ('sent','skipped') ORDER BY seq LIMIT ?) and
    -- many_blocking (status IN ('retry','dead') LIMIT ?).
    KEY outbox_events_status_seq (status, seq),
    -- outbox_events_retry_due: the window's due retries (status = 'retry'
    -- AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?).
    KEY outbox_events_retry_due (status, next_attempt_at),
    -- outbox_events_blocking and outbox_events_held: the window's blocked
    -- probes (one per status: status = 'retry' / 'dead' / 'held' AND
    -- aggregate_key = ? AND seq < ?), the hold's head lookup, the explicit
    -- release (status = 'held' AND aggregate_key = ?), the orphan release,
    -- stats' blocked aggregates, the admin's head and replay by aggregate.
    KEY outbox_events_aggregate (status, aggregate_key, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- One row: settings every relay on this outbox obeys.
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}outbox_settings (
    singleton      BOOLEAN     NOT NULL DEFAULT TRUE PRIMARY KEY CHECK (singleton = TRUE),
    delivery_order VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
        DEFAULT 'per_aggregate' CHECK (delivery_order IN ('per_aggregate', 'unordered'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- The singleton row, once: a re-run finds it and changes nothing (not
-- INSERT IGNORE, which would also turn other errors into warnings).
-- step: transaction
INSERT INTO {schema}outbox_settings (singleton) VALUES (TRUE)
    ON DUPLICATE KEY UPDATE singleton = singleton;

-- The inbox: one row per (consumer, event) received. `duplicates` counts
-- redeliveries: the inbox inserts with ON DUPLICATE KEY UPDATE
-- duplicates = duplicates + 1, so that with CLIENT_FOUND_ROWS the affected
-- rows say 1 (first time) or 2 (duplicate), and no error is hidden.
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}inbox_events (
    consumer    VARCHAR(255) NOT NULL,
    event_id    CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    received_at DATETIME(6)  NOT NULL DEFAULT UTC_TIMESTAMP(6),
    duplicates  INT          NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, event_id),
    KEY inbox_events_received_at (received_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- The last failed attempts of each event (the relay keeps 20 per event).
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}outbox_attempts (
    id        BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_seq BIGINT      NOT NULL,
    at        DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6),
    relay     VARCHAR(255),
    outcome   VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
        CHECK (outcome IN ('retry', 'dead', 'suspect')),
    error     MEDIUMTEXT  NOT NULL,
    KEY outbox_attempts_event (event_seq, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- Every mutation an operator ran: who, what, which selection, when, how
-- many rows it changed and how it ended (`finished_at`/`outcome` NULL
-- while it runs, and for ever if it was killed).
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}outbox_audit (
    id          BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at          DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6),
    identity    TEXT        NOT NULL,
    action      TEXT        NOT NULL,
    target      LONGTEXT    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
        CHECK (JSON_VALID(target)),
    count       BIGINT      NOT NULL DEFAULT 0,
    finished_at DATETIME(6),
    outcome     TEXT
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- Relays register here and heartbeat every stats interval; an operator
-- pauses one by setting `paused`.
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}outbox_relays (
    name                  VARCHAR(255) NOT NULL PRIMARY KEY,
    host                  TEXT         NOT NULL,
    pid                   INT          NOT NULL,
    version               TEXT         NOT NULL,
    started_at            DATETIME(6)  NOT NULL,
    heartbeat_at          DATETIME(6)  NOT NULL,
    heartbeat_interval_ms BIGINT       NOT NULL,
    in_flight             INT          NOT NULL DEFAULT 0,
    paused                BOOLEAN      NOT NULL DEFAULT FALSE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;

-- Consumers' dead letters (the queue holds the messages; this is their
-- index). Rows are kept until deleted by hand.
-- step: transaction
CREATE TABLE IF NOT EXISTS {schema}inbox_dead_letters (
    id                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer          VARCHAR(255) NOT NULL,
    queue             VARCHAR(255) NOT NULL,
    exchange          VARCHAR(255) NOT NULL,
    routing_key       VARCHAR(255) NOT NULL,
    event_id          CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin,
    message_id        VARCHAR(255),
    event_type        VARCHAR(255),
    attempts          INT          NOT NULL,
    reason            MEDIUMTEXT   NOT NULL,
    headers           LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
        DEFAULT '{}' CHECK (JSON_VALID(headers)),
    payload           LONGTEXT     NOT NULL,
    payload_truncated BOOLEAN      NOT NULL DEFAULT FALSE,
    dead_lettered_at  DATETIME(6)  NOT NULL DEFAULT UTC_TIMESTAMP(6),
    replayed_at       DATETIME(6),
    purged_at         DATETIME(6),
    -- PostgreSQL indexes the expression headers ->> 'x-outbox-dead-letter-id';
    -- MariaDB indexes a stored generated column instead. JSON_VALUE gives
    -- the unquoted string (NULL when absent or not a scalar). Cut to 255
    -- characters so that no header value can make the INSERT fail
    -- (the consumer writes a UUID there): the replay compares this column
    -- (index) and the full expression.
    dead_letter_id    VARCHAR(255) AS
        (LEFT(JSON_VALUE(headers, '$."x-outbox-dead-letter-id"'), 255)) STORED,
    KEY inbox_dead_letters_queue (queue, id),
    KEY inbox_dead_letters_letter_id (dead_letter_id),
    -- PostgreSQL's partial index on open records (replayed_at IS NULL AND
    -- purged_at IS NULL): the replay's match by event among open records
    -- (queue = ? AND event_id = ? AND replayed_at IS NULL AND purged_at IS
    -- NULL) seeks the first two columns and filters the rest in the index.
    KEY inbox_dead_letters_open_event (queue, event_id, replayed_at, purged_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin;
