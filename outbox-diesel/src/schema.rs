//! The tables, their indexes, and the migrations that create them.
//!
//! Two tables with fixed names, `outbox_events` and `inbox_events`, live in a
//! schema of your choice (default `public`), next to `outbox_settings` (one
//! row: the delivery order of this outbox) and `outbox_schema_version` (this
//! library's own migration history, never diesel's
//! `__diesel_schema_migrations`, which your own reverts could touch).
//!
//! ```sql
#![doc = include_str!("../sql/001_outbox.sql")]
//! ```
//!
//! Later migrations (`sql/002_held.sql`, `sql/003_drop_unsent.sql`,
//! `sql/004_suspect_count.sql`, `sql/005_admin.sql`) add the `held` status,
//! the indexes below, the suspect count, and the admin API's tables
//! (`outbox_attempts`, `outbox_audit`, `outbox_relays`, and consumers' dead
//! letters in `inbox_dead_letters`) with autovacuum
//! settings for a table that works as a queue (the migration says why); see
//! [`migrate`](crate::migrate) for how they are applied to a table in use.
//!
//! # Why these indexes
//! - **`outbox_events_pkey (seq)`**: the order of events; purges walk it.
//! - **`outbox_events_id_key (id)`**: event ids are unique; operators look
//!   events up by id (replay, skip).
//! - **`outbox_events_pending (seq) WHERE status = 'pending'`**: the claim
//!   reads its window from it in `seq` order. It holds only pending rows, so
//!   a claim costs the same with millions of sent rows kept for audit, and
//!   with any number of rows held behind blocked aggregates.
//! - **`outbox_events_retry_due (next_attempt_at) WHERE status = 'retry'`**:
//!   the retries that are due, without walking those that are not.
//! - **`outbox_events_blocking (aggregate_type, aggregate_id, seq) WHERE
//!   status IN ('retry','dead')`**: the events that hold their aggregate
//!   back. The claim hashes the aggregates in it and probes it for the rows
//!   of those; it stays near-empty while the broker is healthy, so it costs
//!   recording nothing.
//! - **`outbox_events_held (aggregate_type, aggregate_id, seq) WHERE status
//!   = 'held'`**: the ordering probe and the release of held events.
//! - **`outbox_events_failed (seq) WHERE status IN ('retry','dead','skipped')`**
//!   (migration 5): the admin API's chunked replay, skip and retry-now and
//!   its listings of failed events walk it in `seq` order; empty while
//!   nothing fails.
//! - **`outbox_attempts_event (event_seq, id)`**: an event's attempt history
//!   and its trim to the last 20.
//! - **`inbox_events_pkey (consumer, event_id)`**: the dedup decision itself.
//!
//! # Privileges
//! A relay's database role needs `SELECT, INSERT, UPDATE, DELETE` on
//! `outbox_events` and `outbox_attempts`, `SELECT, INSERT, UPDATE, DELETE`
//! on `outbox_relays` (its registration and heartbeat), `SELECT` on
//! `outbox_settings` and `outbox_schema_version`; the admin API (CLI,
//! router) also writes `outbox_audit` and deletes from `inbox_events`.
//! Granting per table? Grant the new tables of migration 5 before relays of
//! this version start: a relay that cannot write an attempt cannot mark a
//! failure, so its batch rolls back and is published again.
//!
//! `outbox_events_unsent (seq) WHERE status IN ('pending','retry')`, which
//! relays before migration 2 scan, is dropped by the contract migration 3
//! ([`migrate_contract`](crate::migrate_contract)).

#[cfg(feature = "postgres")]
use std::fmt::Write as _;

use crate::{Error, Result};

#[cfg(feature = "postgres")]
diesel::table! {
    /// The outbox (`outbox_events`). This definition has no schema: it names
    /// the table found through `search_path` (the default schema `public`).
    /// It lists 16 columns, diesel's limit without its `32-column-tables`
    /// feature: `unroutable_since` (migration 2) is left out.
    outbox_events (seq) {
        /// Database-assigned order.
        seq -> Int8,
        /// Event id (UUID v7).
        id -> Uuid,
        /// Aggregate type.
        aggregate_type -> Text,
        /// Aggregate id.
        aggregate_id -> Text,
        /// Aggregate version, if tracked.
        aggregate_version -> Nullable<Int8>,
        /// Event type.
        event_type -> Text,
        /// Payload schema version.
        schema_version -> Int4,
        /// JSON payload, stored byte-exact (`json`, not `jsonb`).
        payload -> Json,
        /// String headers.
        headers -> Jsonb,
        /// When the event was recorded.
        occurred_at -> Timestamptz,
        /// `pending`, `retry`, `sent`, `dead` or `skipped`.
        status -> Text,
        /// Failed attempts.
        attempts -> Int4,
        /// When a `retry` event is due.
        next_attempt_at -> Nullable<Timestamptz>,
        /// Reason of the last failure.
        last_error -> Nullable<Text>,
        /// When the broker confirmed it.
        published_at -> Nullable<Timestamptz>,
        /// How many times the broker connection died while it was in
        /// flight (migration 4); from 1 on it is published alone.
        suspect_count -> Int4,
    }
}

#[cfg(feature = "postgres")]
diesel::table! {
    /// The inbox (`inbox_events`), found through `search_path`.
    inbox_events (consumer, event_id) {
        /// Consumer name.
        consumer -> Text,
        /// Event id.
        event_id -> Uuid,
        /// When it was first received.
        received_at -> Timestamptz,
    }
}

/// When a migration may be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// Adds what a new version needs without breaking relays of earlier
    /// versions: applied by [`migrate`](crate::migrate).
    Expand,
    /// Removes what only earlier versions used: applied by
    /// [`migrate_contract`](crate::migrate_contract), once no relay of an
    /// earlier version runs on the outbox.
    Contract,
}

/// How one step of a migration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepKind {
    /// In a transaction, with a short `lock_timeout` (retried).
    Transaction,
    /// On its own, outside a transaction (`CREATE INDEX CONCURRENTLY`).
    Concurrently,
}

/// One step of a migration, rendered for a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// How it runs.
    pub kind: StepKind,
    /// Its SQL.
    pub sql: String,
}

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version, increasing from 1.
    pub version: i32,
    /// Short name.
    pub name: &'static str,
    /// When it may be applied.
    pub phase: Phase,
    /// SQL with `{schema}` where the quoted schema name goes, split into
    /// steps by `-- step: transaction` and `-- step: concurrently` lines (a
    /// migration without them is one transactional step).
    pub sql: &'static str,
}

impl Migration {
    /// Its steps for `schema`, in order.
    pub fn steps(&self, schema: &Schema) -> Vec<Step> {
        let mut steps: Vec<Step> = Vec::new();
        let mut kind = StepKind::Transaction;
        let mut sql = String::new();
        let mut flush = |kind: StepKind, sql: &mut String| {
            if sql.lines().any(|l| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with("--")
            }) {
                steps.push(Step {
                    kind,
                    sql: schema.render_sql(sql.trim()),
                });
            }
            sql.clear();
        };
        for line in self.sql.lines() {
            let marker = line.trim().strip_prefix("-- step:").map(str::trim);
            match marker {
                Some(next) => {
                    flush(kind, &mut sql);
                    kind = if next == "concurrently" {
                        StepKind::Concurrently
                    } else {
                        StepKind::Transaction
                    };
                }
                None => {
                    sql.push_str(line);
                    sql.push('\n');
                }
            }
        }
        flush(kind, &mut sql);
        steps
    }
}

#[cfg(feature = "postgres")]
/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "outbox and inbox tables",
        phase: Phase::Expand,
        sql: include_str!("../sql/001_outbox.sql"),
    },
    Migration {
        version: 2,
        name: "held status and claim indexes",
        phase: Phase::Expand,
        sql: include_str!("../sql/002_held.sql"),
    },
    Migration {
        version: 3,
        name: "drop outbox_events_unsent",
        phase: Phase::Contract,
        sql: include_str!("../sql/003_drop_unsent.sql"),
    },
    Migration {
        version: 4,
        name: "suspect count",
        phase: Phase::Expand,
        sql: include_str!("../sql/004_suspect_count.sql"),
    },
    Migration {
        version: 5,
        name: "admin tables and autovacuum settings",
        phase: Phase::Expand,
        sql: include_str!("../sql/005_admin.sql"),
    },
];

#[cfg(feature = "postgres")]
/// The newest migration a store of this version needs applied; relays
/// refuse to claim from an outbox below it (run [`migrate`](crate::migrate)).
pub(crate) const REQUIRED_VERSION: i32 = 5;

#[cfg(feature = "postgres")]
/// The newest migration this version knows; relays refuse to claim from an
/// outbox migrated past it by a newer version.
pub(crate) const KNOWN_VERSION: i32 = 5;

/// A validated PostgreSQL schema name and the identifiers derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    name: String,
    quoted: String,
}

impl Default for Schema {
    fn default() -> Self {
        Schema {
            name: "public".into(),
            quoted: "\"public\"".into(),
        }
    }
}

impl Schema {
    /// Validates `name`: 1..=63 bytes, no NUL. Any other character is fine;
    /// the name is always quoted.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty, too long or NUL-containing name.
    pub fn new(name: &str) -> Result<Self> {
        if name.is_empty() || name.len() > 63 || name.contains('\0') {
            return Err(Error::Config(format!(
                "schema name {name:?} must be 1 to 63 bytes without NUL"
            )));
        }
        Ok(Schema {
            name: name.to_owned(),
            quoted: format!("\"{}\"", name.replace('"', "\"\"")),
        })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quoted schema name, e.g. `"public"`.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// `"schema"."table"`.
    pub fn table(&self, table: &str) -> String {
        format!("{}.{table}", self.quoted)
    }

    /// The `NOTIFY` channel for new events in this schema's outbox:
    /// `outbox_events.<schema>`, which recording (`pg_notify`) and the
    /// relay's `LISTEN` both use.
    ///
    /// PostgreSQL channel names are identifiers of at most 63 bytes
    /// (`pg_notify` refuses longer ones, `LISTEN` truncates them). For a
    /// schema name longer than 49 bytes the channel is shortened, stably:
    /// `outbox_events.`, the first bytes of the name (at most 32, cut at a
    /// character boundary), `~` and the 64-bit FNV-1a hash of the whole name
    /// in hex, 63 bytes at most. So long names sharing a prefix still get
    /// channels of their own, every process derives the same one, and short
    /// names keep the channel they always had. (A shortened channel could
    /// only coincide with that of a 49-byte schema whose name is literally
    /// such a prefix, `~` and that hash; the cost would be extra wakeups,
    /// never a missed event.)
    ///
    /// ```
    /// use outbox_diesel::Schema;
    ///
    /// assert_eq!(Schema::new("billing")?.channel(), "outbox_events.billing");
    /// let long = Schema::new(&"s".repeat(63))?.channel();
    /// assert!(long.len() <= 63 && long.starts_with("outbox_events.sss"));
    /// # Ok::<(), outbox_diesel::Error>(())
    /// ```
    pub fn channel(&self) -> String {
        /// PostgreSQL's `NAMEDATALEN - 1`.
        const MAX: usize = 63;
        const PREFIX: &str = "outbox_events.";
        let full = format!("{PREFIX}{}", self.name);
        if full.len() <= MAX {
            return full;
        }
        // FNV-1a: stable across builds and platforms (std's hasher is not).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.name.as_bytes() {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let suffix = format!("~{hash:016x}");
        let mut keep = MAX - PREFIX.len() - suffix.len();
        while !self.name.is_char_boundary(keep) {
            keep -= 1;
        }
        format!("{PREFIX}{}{suffix}", &self.name[..keep])
    }

    /// The channel as a quoted identifier, for `LISTEN`.
    pub fn quoted_channel(&self) -> String {
        format!("\"{}\"", self.channel().replace('"', "\"\""))
    }

    #[cfg(feature = "postgres")]
    /// The key of the advisory lock that serializes migrations of this schema.
    pub(crate) fn lock_key(&self) -> i64 {
        // FNV-1a: stable across builds and platforms (std's hasher is not).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in b"outbox-migrations:".iter().chain(self.name.as_bytes()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        i64::from_ne_bytes(hash.to_ne_bytes())
    }

    /// The SQL of `migration` for this schema.
    pub fn render(&self, migration: &Migration) -> String {
        self.render_sql(migration.sql)
    }

    fn render_sql(&self, sql: &str) -> String {
        sql.replace("{schema}", &self.quoted)
    }
}

#[cfg(feature = "postgres")]
/// `CREATE TABLE IF NOT EXISTS` of the library's migration history table.
pub(crate) fn version_table_sql(schema: &Schema) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
        schema.table("outbox_schema_version")
    )
}

#[cfg(feature = "postgres")]
/// The whole DDL of a **new** outbox in `schema`, for teams that run their
/// own migrations: apply it once (it may run in one transaction). To
/// upgrade an existing outbox by hand, run each new migration's
/// [`steps`](Migration::steps) instead, those of kind
/// [`StepKind::Concurrently`] outside a transaction. It is what [`migrate`](crate::migrate) applies, including
/// the version rows, so switching to `migrate` later finds nothing to redo.
///
/// ```
/// let ddl = outbox_diesel::ddl("billing")?;
/// assert!(ddl.contains(r#"CREATE TABLE "billing".outbox_events"#));
/// # Ok::<(), outbox_diesel::Error>(())
/// ```
///
/// # Errors
/// [`Error::Config`] for an invalid schema name.
pub fn ddl(schema: &str) -> Result<String> {
    let schema = Schema::new(schema)?;
    let mut out = format!(
        "CREATE SCHEMA IF NOT EXISTS {q};\n{}\n",
        version_table_sql(&schema),
        q = schema.quoted
    );
    for migration in MIGRATIONS {
        // On a new table nothing waits for an index build, and the whole
        // DDL may run in one transaction, where CONCURRENTLY cannot.
        let sql: Vec<String> = migration
            .steps(&schema)
            .into_iter()
            .map(|step| match step.kind {
                StepKind::Concurrently => step.sql.replace(" CONCURRENTLY", ""),
                _ => step.sql,
            })
            .collect();
        let _ = writeln!(
            out,
            "-- migration {}: {}\n{}\nINSERT INTO {} (version, name) VALUES ({}, '{}') \
             ON CONFLICT DO NOTHING;",
            migration.version,
            migration.name,
            sql.join("\n"),
            schema.table("outbox_schema_version"),
            migration.version,
            migration.name.replace('\'', "''"),
        );
    }
    Ok(out)
}
