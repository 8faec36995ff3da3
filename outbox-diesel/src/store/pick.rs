//! Picking and locking a claim's rows in its transaction: the claim
//! statement for the delivery order and the number of blocking events, the
//! schema version checked once, per-aggregate runs kept, and malformed rows
//! marked dead (their aggregates cut).

use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::admin::normalize_error;
use outbox_core::{DeliveryOrder, OutboxRecord};

use super::PgOutboxStore;
use super::claim::{WindowSlot, followers, hold};
use super::row::{EventRow, ManyRow, UnorderedRow, VersionRow, WindowRow};
use crate::plan;
use crate::prepared::PreparedExt;
use crate::schema::{KNOWN_VERSION, REQUIRED_VERSION};
use crate::{Error, Result};

/// How long a claim trusts its count of blocking events.
const BLOCKING_CACHE_TTL: Duration = Duration::from_secs(5);

/// Above this many `retry` and `dead` events, an ordered claim probes every
/// row of its window instead of first hashing the aggregates that have
/// such events: a probe costs 2–3 index pages per row (about 1,000 for a
/// window of 400), a hashed set about one page per 120 aggregates plus its
/// hashing, which costs as much as the probes at about 2,000–5,000 rows
/// (measured: 261 buffers at 5,000 dead rows, 443 at 20,000, 721 at 45,000,
/// against 1,400–2,200 for the probing claim).
const MANY_BLOCKING: i64 = 4_000;

impl PgOutboxStore {
    /// The ordered claim statement for the number of blocking events now.
    pub(super) async fn ordered_claim(&self, conn: &mut AsyncPgConnection) -> Result<&str> {
        let cached = *self
            .blocking_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let many = match cached {
            Some((many, read_at)) if read_at.elapsed() < BLOCKING_CACHE_TTL => many,
            _ => {
                let row: ManyRow = diesel::sql_query(&self.sql.many_blocking)
                    .bind::<BigInt, _>(MANY_BLOCKING)
                    .prepared(self.prepare)
                    .get_result(conn)
                    .await?;
                *self
                    .blocking_cache
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((row.many, Instant::now()));
                row.many
            }
        };
        Ok(if many {
            &self.sql.claim_ordered_probing
        } else {
            &self.sql.claim_ordered
        })
    }

    /// Refuses an outbox whose schema this version cannot work on: one not
    /// migrated far enough, or one a newer version migrated past what it
    /// knows. Checked once per store.
    async fn check_version(&self, conn: &mut AsyncPgConnection) -> Result<()> {
        use std::sync::atomic::Ordering;
        if std::sync::atomic::AtomicBool::load(&self.version_ok, Ordering::Relaxed) {
            return Ok(());
        }
        let found = diesel::sql_query(&self.sql.schema_version)
            .get_result::<VersionRow>(conn)
            .await?
            .version;
        if !(REQUIRED_VERSION..=KNOWN_VERSION).contains(&found) {
            return Err(Error::SchemaVersion {
                schema: self.schema.name().to_owned(),
                found,
                min: REQUIRED_VERSION,
                max: KNOWN_VERSION,
            });
        }
        self.version_ok.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Picks and locks rows inside the transaction open on `conn`, for the
    /// relay named `relay` (nothing when an operator paused it), or for no
    /// relay.
    pub(super) async fn claim_rows(
        &self,
        conn: &mut AsyncPgConnection,
        limit: usize,
        relay: Option<&str>,
    ) -> Result<ClaimedRows> {
        self.check_version(conn).await?;
        // The claim's first statement also sets the session's
        // idle_in_transaction_session_timeout for this transaction only.
        let timeout_ms = self.claim_timeout.as_millis().to_string();
        let order = self.cached_order(conn).await?;
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut claimed = ClaimedRows {
            order,
            paused: false,
            records: Vec::new(),
            window: Vec::new(),
        };
        let rows: Vec<EventRow> = match order {
            DeliveryOrder::Unordered => {
                let rows: Vec<UnorderedRow> = diesel::sql_query(&self.sql.claim_unordered)
                    .bind::<BigInt, _>(limit_i64)
                    .bind::<Text, _>(&timeout_ms)
                    .bind::<Nullable<Text>, _>(relay)
                    .prepared(self.prepare)
                    .load(conn)
                    .await?;
                claimed.paused = rows.iter().any(|row| row.paused);
                rows.into_iter().filter_map(|row| row.locked).collect()
            }
            _ => {
                let window_size = limit_i64.saturating_mul(self.claim_window as i64);
                let sql = self.ordered_claim(conn).await?;
                let window: Vec<WindowRow> = diesel::sql_query(sql)
                    .bind::<BigInt, _>(window_size)
                    .bind::<BigInt, _>(limit_i64)
                    .bind::<Text, _>(&timeout_ms)
                    .bind::<Nullable<Text>, _>(relay)
                    .prepared(self.prepare)
                    .load(conn)
                    .await?;
                claimed.paused = window.iter().any(|row| row.paused);
                let mut locked = Vec::new();
                for row in window.into_iter().filter_map(|row| row.slot) {
                    claimed.window.push(WindowSlot {
                        seq: row.window_seq,
                        aggregate: (row.window_aggregate_type, row.window_aggregate_id),
                        blocked: row.blocked,
                    });
                    locked.push(row.locked);
                }
                plan::keep_runs(
                    claimed
                        .window
                        .iter()
                        .zip(locked)
                        .map(|(slot, locked)| plan::WindowEntry {
                            aggregate: (&slot.aggregate.0, &slot.aggregate.1),
                            blocked: slot.blocked,
                            locked,
                        }),
                    limit,
                )
            }
        };
        // A row another writer stored unreadable ends dead with the reason;
        // in ordered mode it also ends its aggregate's run (it is the
        // aggregate's head now), and the rest flow.
        // Aggregates cut by a malformed row: almost always none, so the
        // common path allocates nothing for it.
        let mut cut: Vec<(String, String)> = Vec::new();
        for row in rows {
            if cut
                .iter()
                .any(|(t, i)| row.aggregate_type() == t && row.aggregate_id() == i)
            {
                continue;
            }
            match row.into_record() {
                Ok(record) => claimed.records.push(record),
                Err(Error::MalformedRow { seq, reason }) => {
                    tracing::error!(seq, %reason, "outbox: malformed row; marking it dead");
                    diesel::sql_query(&self.sql.kill_malformed)
                        .bind::<BigInt, _>(seq)
                        .bind::<Text, _>(
                            format!("malformed row: {reason}").replace('\0', "\u{FFFD}"),
                        )
                        .bind::<Nullable<Text>, _>(self.relay_name())
                        .bind::<Text, _>(normalize_error(&format!("malformed row: {reason}")))
                        .prepared(self.prepare)
                        .execute(&mut *conn)
                        .await?;
                    // Ordered: its aggregate, from the window, is cut.
                    if let Some(slot) = claimed.window.iter().find(|slot| slot.seq == seq) {
                        let followers = followers(&claimed.window, seq, &slot.aggregate);
                        hold(&self.sql, self.prepare, conn, followers).await?;
                        cut.push(slot.aggregate.clone());
                    }
                }
                Err(other) => return Err(other),
            }
        }
        Ok(claimed)
    }
}

/// What a claim read: the rows it keeps, and its window (for holding the
/// followers of events that fail).
pub(super) struct ClaimedRows {
    pub(super) order: DeliveryOrder,
    /// An operator paused the claiming relay: nothing was read or locked.
    pub(super) paused: bool,
    pub(super) records: Vec<OutboxRecord>,
    pub(super) window: Vec<WindowSlot>,
}
