//! Diesel definitions of the service's tables (created by
//! `migrations/postgres/001_initial.sql`, in the `public` schema).

diesel::table! {
    /// Orders: one row per order aggregate.
    orders (id) {
        /// Order id.
        id -> Uuid,
        /// Who placed it.
        customer_id -> Uuid,
        /// `placed`, `paid`, `cancelled` or `rejected`.
        status -> Text,
        /// Σ quantity × unit price.
        total_cents -> Int8,
        /// Why the inventory rejected it.
        rejection_reason -> Nullable<Text>,
        /// When it was placed.
        created_at -> Timestamptz,
        /// When its status last changed.
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    /// The lines of each order.
    order_items (order_id, line) {
        /// The order.
        order_id -> Uuid,
        /// Position in the request, from 0.
        line -> Int4,
        /// Stock keeping unit.
        sku -> Text,
        /// How many.
        quantity -> Int8,
        /// Price of one.
        unit_price_cents -> Int8,
    }
}

diesel::table! {
    /// Stock per SKU.
    inventory (sku) {
        /// Stock keeping unit.
        sku -> Text,
        /// Units that can be ordered.
        available -> Int8,
        /// Units reserved for orders.
        reserved -> Int8,
    }
}

diesel::table! {
    /// What the inventory did for each order.
    reservations (order_id) {
        /// The order.
        order_id -> Uuid,
        /// `reserved`, `rejected` or `released`.
        status -> Text,
        /// Why it was rejected.
        reason -> Nullable<Text>,
        /// When the status last changed.
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    /// The stock each reservation holds.
    reservation_items (order_id, sku) {
        /// The order.
        order_id -> Uuid,
        /// Stock keeping unit.
        sku -> Text,
        /// Units moved from available to reserved.
        quantity -> Int8,
    }
}

diesel::table! {
    /// Points per customer.
    loyalty_accounts (customer_id) {
        /// The customer.
        customer_id -> Uuid,
        /// Their points.
        points -> Int8,
    }
}

diesel::table! {
    /// Points awarded per paid order.
    loyalty_awards (order_id) {
        /// The order.
        order_id -> Uuid,
        /// Whose points.
        customer_id -> Uuid,
        /// How many it earned.
        points -> Int8,
        /// `awarded` or `revoked`.
        status -> Text,
        /// When the status last changed.
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    /// The service's migration history (the outbox keeps its own).
    ecommerce_schema_version (version) {
        /// Migration number.
        version -> Int4,
        /// Its name.
        name -> Text,
        /// When it was applied.
        applied_at -> Timestamptz,
    }
}

diesel::joinable!(order_items -> orders (order_id));
diesel::joinable!(reservation_items -> reservations (order_id));
diesel::allow_tables_to_appear_in_same_query!(
    orders,
    order_items,
    inventory,
    reservations,
    reservation_items,
    loyalty_accounts,
    loyalty_awards,
);
