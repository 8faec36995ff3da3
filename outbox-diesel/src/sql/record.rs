//! Recording: the `INSERT`s of [`Outbox`](crate::Outbox), with and without
//! the `NOTIFY` that wakes relays (both rendered, so turning it on or off
//! renders nothing).

use crate::schema::Schema;

/// The recorder's statements. Binds of the one-event statements: `$1` id,
/// `$2` aggregate type, `$3` aggregate id, `$4` aggregate version (nullable
/// int8), `$5` event type, `$6` schema version (int4), `$7` payload (text,
/// stored as `json`), `$8` headers (text, stored as `jsonb`), `$9` occurred
/// at; the many-event statements bind the same as arrays, in that order.
#[derive(Debug)]
pub(crate) struct RecordSql {
    /// One event (the common case): a plain `INSERT … VALUES`, which
    /// PostgreSQL plans and runs cheaper than the array path.
    pub(crate) insert_one: String,
    /// Many events: one `INSERT … SELECT FROM UNNEST` of arrays.
    pub(crate) insert_many: String,
    /// [`insert_one`](Self::insert_one) with the `NOTIFY`.
    pub(crate) insert_one_notify: String,
    /// [`insert_many`](Self::insert_many) with the `NOTIFY`.
    pub(crate) insert_many_notify: String,
}

impl RecordSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        let table = schema.table("outbox_events");
        let insert_many = format!(
            "INSERT INTO {table} (id, aggregate_type, aggregate_id, aggregate_version, \
             event_type, schema_version, payload, headers, occurred_at) \
             SELECT u.id, u.aggregate_type, u.aggregate_id, u.aggregate_version, u.event_type, \
             u.schema_version, u.payload::json, u.headers::jsonb, u.occurred_at \
             FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::int8[], $5::text[], \
             $6::int4[], $7::text[], $8::text[], $9::timestamptz[]) \
             AS u(id, aggregate_type, aggregate_id, aggregate_version, event_type, \
             schema_version, payload, headers, occurred_at)"
        );
        let insert_one = format!(
            "INSERT INTO {table} (id, aggregate_type, aggregate_id, aggregate_version, \
             event_type, schema_version, payload, headers, occurred_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7::json, $8::jsonb, $9)"
        );
        // One NOTIFY per statement; PostgreSQL also folds identical
        // notifications of one transaction into one.
        let with_notify = |insert: &str| {
            format!(
                "WITH inserted AS ({insert} RETURNING 1) \
                 SELECT pg_notify('{channel}', '') FROM (SELECT 1 FROM inserted LIMIT 1) AS any_row",
                channel = schema.channel().replace('\'', "''"),
            )
        };
        RecordSql {
            insert_one_notify: with_notify(&insert_one),
            insert_many_notify: with_notify(&insert_many),
            insert_one,
            insert_many,
        }
    }

    /// The `INSERT` of one event or of many, with or without the `NOTIFY`.
    pub(crate) fn insert(&self, one: bool, notify: bool) -> &str {
        match (one, notify) {
            (true, false) => &self.insert_one,
            (false, false) => &self.insert_many,
            (true, true) => &self.insert_one_notify,
            (false, true) => &self.insert_many_notify,
        }
    }
}
