//! The relay's `LISTEN` connection.

use crate::schema::Schema;

/// What the `LISTEN` connection runs when it opens.
#[derive(Debug)]
pub(crate) struct ListenSql {
    /// Names the session (`$1`: [`application_name`](Self::application_name)).
    pub(crate) set_application_name: String,
    /// The session's name, `outbox_listener:<schema>` (a value, bound).
    pub(crate) application_name: String,
    /// `LISTEN` on the schema's channel.
    pub(crate) listen: String,
}

impl ListenSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        ListenSql {
            set_application_name: "SELECT set_config('application_name', $1, false)".to_owned(),
            application_name: format!("outbox_listener:{}", schema.name()),
            listen: format!("LISTEN {}", schema.quoted_channel()),
        }
    }
}
