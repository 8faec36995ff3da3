CREATE TABLE {schema}.outbox_events (
    seq               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                uuid        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint,
    event_type        text        NOT NULL,
    schema_version    integer     NOT NULL,
    payload           json        NOT NULL,  -- json keeps the text byte-exact
    headers           jsonb       NOT NULL DEFAULT '{}',
    occurred_at       timestamptz NOT NULL,
    status            text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'retry', 'sent', 'dead', 'skipped')),
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz,
    last_error        text,
    published_at      timestamptz,
    CONSTRAINT outbox_events_id_key UNIQUE (id)
);

-- What the claim scans, in seq order: unsent rows only.
CREATE INDEX outbox_events_unsent ON {schema}.outbox_events (seq)
    WHERE status IN ('pending', 'retry');

-- Per-aggregate order: earlier events of an aggregate that hold it back.
CREATE INDEX outbox_events_blocking
    ON {schema}.outbox_events (aggregate_type, aggregate_id, seq)
    WHERE status IN ('retry', 'dead');

-- One row: settings every relay on this outbox obeys.
CREATE TABLE {schema}.outbox_settings (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    delivery_order text NOT NULL DEFAULT 'per_aggregate'
        CHECK (delivery_order IN ('per_aggregate', 'unordered'))
);
INSERT INTO {schema}.outbox_settings DEFAULT VALUES;

CREATE TABLE {schema}.inbox_events (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX inbox_events_received_at ON {schema}.inbox_events (received_at);
