-- The service's own tables on MariaDB, next to the outbox's (created by
-- `outbox::mysql::migrate`). DDL is not transactional on MariaDB, so every
-- statement is idempotent (`IF NOT EXISTS`) and the runner holds
-- `GET_LOCK` while applying (see src/db/mysql.rs). Ids are UUIDs as
-- 36-character ASCII text with a binary collation (MariaDB 10.6 has no
-- UUID type); SKUs are binary-collated too, so `Mug` and `mug` stay two
-- SKUs as they are on PostgreSQL (`ascii_bin` pads: `mug` and `mug ` would
-- be one, but a SKU has no spaces: see `is_valid_sku`).

CREATE TABLE IF NOT EXISTS orders (
    id               CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    customer_id      CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status           VARCHAR(16) NOT NULL CHECK (status IN ('placed', 'paid', 'cancelled', 'rejected')),
    total_cents      BIGINT NOT NULL CHECK (total_cents >= 0),
    rejection_reason TEXT,
    created_at       DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at       DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY orders_customer_id (customer_id)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS order_items (
    order_id         CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    line             INT NOT NULL CHECK (line >= 0),
    sku              VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity         BIGINT NOT NULL CHECK (quantity > 0),
    unit_price_cents BIGINT NOT NULL CHECK (unit_price_cents >= 0),
    PRIMARY KEY (order_id, line),
    UNIQUE KEY order_items_sku (order_id, sku),
    FOREIGN KEY (order_id) REFERENCES orders (id) ON DELETE CASCADE
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS inventory (
    sku       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    available BIGINT NOT NULL CHECK (available >= 0),
    reserved  BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS reservations (
    order_id   CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    status     VARCHAR(16) NOT NULL CHECK (status IN ('reserved', 'rejected', 'released')),
    reason     TEXT,
    updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS reservation_items (
    order_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sku      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity BIGINT NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku),
    FOREIGN KEY (order_id) REFERENCES reservations (order_id) ON DELETE CASCADE,
    FOREIGN KEY (sku) REFERENCES inventory (sku)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS loyalty_accounts (
    customer_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    points      BIGINT NOT NULL DEFAULT 0
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS loyalty_awards (
    order_id    CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    customer_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    points      BIGINT NOT NULL CHECK (points >= 0),
    status      VARCHAR(16) NOT NULL CHECK (status IN ('awarded', 'revoked')),
    updated_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB;
