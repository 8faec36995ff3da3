-- The service's own tables, in the `public` schema next to the outbox's
-- `outbox_events` and `inbox_events` (created by `outbox::postgres::migrate`).
-- Applied once, in a transaction holding an advisory lock (see src/db/migrations.rs).

-- Orders (the `api` role). One row per order aggregate: every change to an
-- order locks this row first, so the events of one order are recorded in
-- commit order.
CREATE TABLE orders (
    id               uuid        PRIMARY KEY,
    customer_id      uuid        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('placed', 'paid', 'cancelled', 'rejected')),
    total_cents      bigint      NOT NULL CHECK (total_cents >= 0),
    rejection_reason text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX orders_customer_id ON orders (customer_id);

-- The lines of an order, immutable once placed; `line` keeps the request's order.
CREATE TABLE order_items (
    order_id         uuid   NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line             int    NOT NULL CHECK (line >= 0),
    sku              text   NOT NULL,
    quantity         bigint NOT NULL CHECK (quantity > 0),
    unit_price_cents bigint NOT NULL CHECK (unit_price_cents >= 0),
    PRIMARY KEY (order_id, line),
    UNIQUE (order_id, sku)
);

-- Stock per SKU (the `inventory` role; `PUT /inventory/{sku}` sets `available`).
CREATE TABLE inventory (
    sku       text   PRIMARY KEY,
    available bigint NOT NULL CHECK (available >= 0),
    reserved  bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0)
);

-- What the inventory did for each order: `reserved` (its items are in
-- `reservation_items`), `rejected`, or `released` (cancelled, stock given
-- back; also written when a cancel arrives before its order, so that a late
-- `order.placed` reserves nothing).
CREATE TABLE reservations (
    order_id   uuid        PRIMARY KEY,
    status     text        NOT NULL CHECK (status IN ('reserved', 'rejected', 'released')),
    reason     text,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE reservation_items (
    order_id uuid   NOT NULL REFERENCES reservations (order_id) ON DELETE CASCADE,
    sku      text   NOT NULL REFERENCES inventory (sku),
    quantity bigint NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
);

-- Points per customer (the `loyalty` role).
CREATE TABLE loyalty_accounts (
    customer_id uuid   PRIMARY KEY,
    points      bigint NOT NULL DEFAULT 0
);

-- The points awarded for each paid order, so a cancel takes back exactly
-- those: `awarded`, or `revoked` (also written when a cancel of a paid order
-- arrives before its `order.paid`, so that the late payment awards nothing).
CREATE TABLE loyalty_awards (
    order_id    uuid        PRIMARY KEY,
    customer_id uuid        NOT NULL,
    points      bigint      NOT NULL CHECK (points >= 0),
    status      text        NOT NULL CHECK (status IN ('awarded', 'revoked')),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
