-- The service's own tables on SQLite, next to the outbox's (created by
-- `outbox::sqlite::migrate`). Applied once, in one `BEGIN IMMEDIATE`
-- transaction with its version row (see src/db/sqlite.rs). STRICT tables,
-- so a value of the wrong type is an error rather than stored as is; ids
-- are UUIDs as text; timestamps are ISO 8601 text in UTC.

CREATE TABLE orders (
    id               TEXT    PRIMARY KEY NOT NULL,
    customer_id      TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('placed', 'paid', 'cancelled', 'rejected')),
    total_cents      INTEGER NOT NULL CHECK (total_cents >= 0),
    rejection_reason TEXT,
    created_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;

CREATE INDEX orders_customer_id ON orders (customer_id);

CREATE TABLE order_items (
    order_id         TEXT    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line             INTEGER NOT NULL CHECK (line >= 0),
    sku              TEXT    NOT NULL,
    quantity         INTEGER NOT NULL CHECK (quantity > 0),
    unit_price_cents INTEGER NOT NULL CHECK (unit_price_cents >= 0),
    PRIMARY KEY (order_id, line),
    UNIQUE (order_id, sku)
) STRICT;

CREATE TABLE inventory (
    sku       TEXT    PRIMARY KEY NOT NULL,
    available INTEGER NOT NULL CHECK (available >= 0),
    reserved  INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0)
) STRICT;

CREATE TABLE reservations (
    order_id   TEXT PRIMARY KEY NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('reserved', 'rejected', 'released')),
    reason     TEXT,
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;

CREATE TABLE reservation_items (
    order_id TEXT    NOT NULL REFERENCES reservations (order_id) ON DELETE CASCADE,
    sku      TEXT    NOT NULL REFERENCES inventory (sku),
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
) STRICT;

CREATE TABLE loyalty_accounts (
    customer_id TEXT    PRIMARY KEY NOT NULL,
    points      INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE loyalty_awards (
    order_id    TEXT    PRIMARY KEY NOT NULL,
    customer_id TEXT    NOT NULL,
    points      INTEGER NOT NULL CHECK (points >= 0),
    status      TEXT    NOT NULL CHECK (status IN ('awarded', 'revoked')),
    updated_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;
