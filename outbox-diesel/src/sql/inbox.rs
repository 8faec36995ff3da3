//! The inbox's statements ([`PgInbox`](crate::PgInbox)).

use crate::schema::Schema;

/// The inbox's statements.
#[derive(Debug)]
pub(crate) struct InboxSql {
    /// Records a delivery (`$1` consumer, `$2` event id); one row
    /// inserted means first time, none a duplicate.
    pub(crate) insert: String,
    /// Records several deliveries (`$1` consumer, `$2` the event ids);
    /// returns the ids inserted (first time), the others are duplicates.
    pub(crate) insert_all: String,
    /// Deletes up to `$2` entries received before `$1`.
    pub(crate) purge: String,
}

impl InboxSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        let t = schema.table("inbox_events");
        InboxSql {
            insert: format!(
                "INSERT INTO {t} (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            ),
            insert_all: format!(
                "INSERT INTO {t} (consumer, event_id) SELECT $1, unnest($2::uuid[]) \
                 ON CONFLICT DO NOTHING RETURNING event_id"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE ctid IN ( \
                   SELECT ctid FROM {t} WHERE received_at < $1 ORDER BY received_at LIMIT $2)"
            ),
        }
    }
}
