//! A SQLite claim: how it is taken (a lease, in one short write
//! transaction), its buffered marks, and `finish` (the second one).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::RunQueryDsl;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox_core::admin::normalize_error;
use outbox_core::{Claim, Claimed, DeliveryOrder, FailedAttempt, OutboxRecord};
use serde_json::json;
use uuid::Uuid;

use super::row::{EventRow, PausedRow, SeqRow, WindowRow};
use super::sql::SqliteStoreSql;
use super::{SqliteOutboxStore, now};
use crate::plan::{self, WindowSlot, checked_seqs, followers};
use crate::prepared::PreparedExt;
use crate::sqlite::AsyncSqliteConnection;
use crate::sqlite::sql::micros;
use crate::{Error, Result, SqliteTransaction};

fn seqs_json(seqs: &[i64]) -> String {
    serde_json::Value::from(seqs).to_string()
}

fn seqs_of(rows: Vec<SeqRow>) -> Vec<i64> {
    rows.into_iter().map(|r| r.seq).collect()
}

impl SqliteOutboxStore {
    pub(super) async fn claim_as(
        &self,
        relay: Option<&str>,
        limit: usize,
    ) -> Result<Claimed<SqliteClaim>> {
        // `BEGIN IMMEDIATE`: the write lock, for a millisecond or so. A
        // dropped transaction (an error below) closes its connection, which
        // rolls back.
        let mut tx = SqliteTransaction::begin(&self.pool).await?;
        self.check_version(&mut tx).await?;
        let order = self.cached_order(&mut tx).await?;
        let claimed_at = Instant::now();
        let now_us = now();
        let lease_us = i64::try_from(self.claim_timeout.as_micros()).unwrap_or(i64::MAX);
        let lease_until = now_us.saturating_add(lease_us);
        // Unique per claim (v7: a time and 74 random bits).
        let token = Uuid::now_v7().to_string();
        let relay_name = relay.map(str::to_owned).or_else(|| self.relay_name());
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut window = Vec::new();
        let mut rows: Vec<EventRow> = if order == DeliveryOrder::Unordered {
            let rows: Vec<EventRow> = diesel::sql_query(&self.sql.claim_unordered)
                .bind::<BigInt, _>(limit_i64)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<BigInt, _>(now_us)
                .bind::<Text, _>(&token)
                .bind::<BigInt, _>(lease_until)
                .prepared(self.prepare)
                .load(&mut *tx)
                .await?;
            if rows.is_empty() {
                let paused: PausedRow = diesel::sql_query(&self.sql.claim_paused)
                    .bind::<Nullable<Text>, _>(relay)
                    .get_result(&mut *tx)
                    .await?;
                tx.commit().await?;
                return Ok(if paused.paused {
                    Claimed::Paused
                } else {
                    Claimed::Empty
                });
            }
            rows
        } else {
            let size = limit_i64.saturating_mul(self.claim_window as i64);
            let read: Vec<WindowRow> = diesel::sql_query(&self.sql.window)
                .bind::<BigInt, _>(size)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<BigInt, _>(now_us)
                .prepared(self.prepare)
                .load(&mut *tx)
                .await?;
            if read.iter().any(|row| row.paused) {
                tx.commit().await?;
                return Ok(Claimed::Paused);
            }
            let slots: Vec<_> = read.into_iter().filter_map(|row| row.slot).collect();
            // A live lease of another claim counts as a lock.
            let kept = plan::keep_runs(
                slots.iter().map(|slot| plan::WindowEntry {
                    aggregate: (
                        slot.window_aggregate_type.as_str(),
                        slot.window_aggregate_id.as_str(),
                    ),
                    blocked: slot.blocked,
                    locked: (!slot.locked).then_some(slot.window_seq),
                }),
                limit,
            );
            window = slots
                .into_iter()
                .map(|slot| WindowSlot {
                    seq: slot.window_seq,
                    aggregate: (slot.window_aggregate_type, slot.window_aggregate_id),
                    blocked: slot.blocked,
                })
                .collect();
            let taken: Vec<EventRow> = if kept.is_empty() {
                Vec::new()
            } else {
                diesel::sql_query(&self.sql.take)
                    .bind::<Text, _>(seqs_json(&kept))
                    .bind::<Text, _>(&token)
                    .bind::<BigInt, _>(lease_until)
                    .bind::<BigInt, _>(now_us)
                    .prepared(self.prepare)
                    .load(&mut *tx)
                    .await?
            };
            let blocked: Vec<i64> = window.iter().filter(|w| w.blocked).map(|w| w.seq).collect();
            hold(&self.sql, self.prepare, &mut tx, &blocked, now_us, &token).await?;
            taken
        };
        // `RETURNING` gives rows in no defined order.
        rows.sort_unstable_by_key(|row| row.seq);
        let mut records = Vec::with_capacity(rows.len());
        let mut cut: Vec<(String, String)> = Vec::new();
        for row in rows {
            if cut
                .iter()
                .any(|(t, i)| row.aggregate_type == *t && row.aggregate_id == *i)
            {
                continue;
            }
            match row.into_record() {
                Ok(record) => records.push(record),
                Err(Error::MalformedRow { seq, reason }) => {
                    tracing::error!(seq, %reason, "outbox: malformed row; marking it dead");
                    let error = format!("malformed row: {reason}");
                    diesel::sql_query(&self.sql.kill)
                        .bind::<BigInt, _>(seq)
                        .bind::<Text, _>(&error)
                        .bind::<Text, _>(normalize_error(&error))
                        .execute(&mut *tx)
                        .await?;
                    diesel::sql_query(&self.sql.kill_attempt)
                        .bind::<BigInt, _>(seq)
                        .bind::<Text, _>(&error)
                        .bind::<Nullable<Text>, _>(relay_name.as_deref())
                        .bind::<BigInt, _>(now_us)
                        .execute(&mut *tx)
                        .await?;
                    trim(&self.sql, self.prepare, &mut tx, &seqs_json(&[seq])).await?;
                    if let Some(slot) = window.iter().find(|slot| slot.seq == seq) {
                        // Its aggregate's later rows wait behind it; those
                        // this claim leased are not handed out.
                        let behind = followers(&window, seq, &slot.aggregate);
                        hold(&self.sql, self.prepare, &mut tx, &behind, now_us, &token).await?;
                        diesel::sql_query(&self.sql.release_lease_seqs)
                            .bind::<Text, _>(seqs_json(&behind))
                            .bind::<Text, _>(&token)
                            .execute(&mut *tx)
                            .await?;
                        cut.push(slot.aggregate.clone());
                    }
                }
                Err(other) => return Err(other),
            }
        }
        // Committed even when empty: the claim may have held rows or marked
        // malformed ones dead.
        tx.commit().await?;
        if records.is_empty() {
            return Ok(Claimed::Empty);
        }
        Ok(Claimed::Batch(SqliteClaim {
            pool: self.pool.clone(),
            sql: Arc::clone(&self.sql),
            prepare: self.prepare,
            keep_sent: self.keep_sent,
            token,
            records,
            window,
            order,
            valid_until: claimed_at + self.claim_timeout.mul_f64(0.8),
            relay: relay_name,
            marks: Vec::new(),
            finished: false,
        }))
    }
}

/// Holds `seqs` (blocked events) that have a `retry` or `dead` event before
/// them and no live lease of another claim.
async fn hold(
    sql: &SqliteStoreSql,
    prepare: bool,
    conn: &mut AsyncSqliteConnection,
    seqs: &[i64],
    now_us: i64,
    token: &str,
) -> Result<()> {
    if seqs.is_empty() {
        return Ok(());
    }
    diesel::sql_query(&sql.hold)
        .bind::<Text, _>(seqs_json(seqs))
        .bind::<BigInt, _>(now_us)
        .bind::<Text, _>(token)
        .prepared(prepare)
        .execute(conn)
        .await?;
    Ok(())
}

/// Keeps the newest `ATTEMPTS_KEPT` attempts of the events `seqs` (JSON).
async fn trim(
    sql: &SqliteStoreSql,
    prepare: bool,
    conn: &mut AsyncSqliteConnection,
    seqs: &str,
) -> Result<()> {
    diesel::sql_query(&sql.trim)
        .bind::<Text, _>(seqs)
        .prepared(prepare)
        .execute(conn)
        .await?;
    Ok(())
}

/// A mark, checked when it was called and applied by `finish`.
#[derive(Debug)]
enum Mark {
    Sent(Vec<i64>),
    Suspect {
        seqs: Vec<i64>,
        reason: String,
    },
    Failed {
        seqs: Vec<i64>,
        /// JSON rows `[seq, status, attempts, next_us, error,
        /// unroutable_us, group]`.
        rows: String,
        /// The window's later events of the failed ones' aggregates.
        held: Vec<i64>,
    },
}

/// A batch leased on SQLite: no transaction is open while it is published.
/// Its marks are checked at once and applied by [`finish`](Claim::finish)
/// in one write transaction, fenced by the claim's lease token. Dropped
/// without `finish`, it clears its leases in the background.
pub struct SqliteClaim {
    pool: Pool<AsyncSqliteConnection>,
    sql: Arc<SqliteStoreSql>,
    prepare: bool,
    keep_sent: bool,
    token: String,
    records: Vec<OutboxRecord>,
    window: Vec<WindowSlot>,
    order: DeliveryOrder,
    valid_until: Instant,
    relay: Option<String>,
    marks: Vec<Mark>,
    finished: bool,
}

impl std::fmt::Debug for SqliteClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteClaim")
            .field("records", &self.records.len())
            .field("order", &self.order)
            .field("marks", &self.marks.len())
            .finish_non_exhaustive()
    }
}

impl SqliteClaim {
    /// Applies the marks and clears the leases in one transaction; the
    /// seqs whose lease was lost.
    async fn apply(&mut self) -> Result<Vec<i64>> {
        let sql = Arc::clone(&self.sql);
        let prepare = self.prepare;
        let token = self.token.as_str();
        let mut tx = SqliteTransaction::begin(&self.pool).await?;
        let now_us = now();
        let mut missed: Vec<i64> = Vec::new();
        let mut matched: HashSet<i64> = HashSet::new();
        for mark in std::mem::take(&mut self.marks) {
            let (named, hit) = match mark {
                Mark::Sent(seqs) => {
                    let json = seqs_json(&seqs);
                    let hit: Vec<SeqRow> = if self.keep_sent {
                        diesel::sql_query(&sql.mark_sent_keep)
                            .bind::<Text, _>(&json)
                            .bind::<BigInt, _>(now_us)
                            .bind::<Text, _>(token)
                            .prepared(prepare)
                            .load(&mut *tx)
                            .await?
                    } else {
                        diesel::sql_query(&sql.mark_sent_attempts)
                            .bind::<Text, _>(&json)
                            .bind::<Text, _>(token)
                            .prepared(prepare)
                            .execute(&mut *tx)
                            .await?;
                        diesel::sql_query(&sql.mark_sent_delete)
                            .bind::<Text, _>(&json)
                            .bind::<Text, _>(token)
                            .prepared(prepare)
                            .load(&mut *tx)
                            .await?
                    };
                    (seqs, hit)
                }
                Mark::Suspect { seqs, reason } => {
                    let json = seqs_json(&seqs);
                    diesel::sql_query(&sql.suspect_attempts)
                        .bind::<Text, _>(&json)
                        .bind::<Text, _>(&reason)
                        .bind::<Nullable<Text>, _>(self.relay.as_deref())
                        .bind::<Text, _>(token)
                        .bind::<BigInt, _>(now_us)
                        .prepared(prepare)
                        .execute(&mut *tx)
                        .await?;
                    let hit: Vec<SeqRow> = diesel::sql_query(&sql.mark_suspect)
                        .bind::<Text, _>(&json)
                        .bind::<Text, _>(&reason)
                        .bind::<Text, _>(normalize_error(&reason))
                        .bind::<Text, _>(token)
                        .prepared(prepare)
                        .load(&mut *tx)
                        .await?;
                    trim(&sql, prepare, &mut tx, &json).await?;
                    (seqs, hit)
                }
                Mark::Failed { seqs, rows, held } => {
                    diesel::sql_query(&sql.failed_attempts)
                        .bind::<Text, _>(&rows)
                        .bind::<Nullable<Text>, _>(self.relay.as_deref())
                        .bind::<Text, _>(token)
                        .bind::<BigInt, _>(now_us)
                        .prepared(prepare)
                        .execute(&mut *tx)
                        .await?;
                    let hit: Vec<SeqRow> = diesel::sql_query(&sql.mark_failed)
                        .bind::<Text, _>(&rows)
                        .bind::<Text, _>(token)
                        .prepared(prepare)
                        .load(&mut *tx)
                        .await?;
                    hold(&sql, prepare, &mut tx, &held, now_us, token).await?;
                    trim(&sql, prepare, &mut tx, &seqs_json(&seqs)).await?;
                    (seqs, hit)
                }
            };
            let hit: HashSet<i64> = seqs_of(hit).into_iter().collect();
            missed.extend(named.iter().filter(|seq| !hit.contains(seq)));
            matched.extend(hit);
        }
        // A seq a mark missed is lost unless this claim changed it itself
        // (held it behind a failure, or marked it in an earlier call).
        missed.retain(|seq| !matched.contains(seq));
        if !missed.is_empty() {
            let still: Vec<SeqRow> = diesel::sql_query(&sql.leased)
                .bind::<Text, _>(seqs_json(&missed))
                .bind::<Text, _>(token)
                .load(&mut *tx)
                .await?;
            let still: HashSet<i64> = seqs_of(still).into_iter().collect();
            missed.retain(|seq| !still.contains(seq));
        }
        diesel::sql_query(&sql.release_lease)
            .bind::<Text, _>(token)
            .prepared(prepare)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        missed.sort_unstable();
        missed.dedup();
        Ok(missed)
    }
}

impl Claim for SqliteClaim {
    type Error = Error;

    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    fn delivery_order(&self) -> DeliveryOrder {
        self.order
    }

    fn valid_until(&self) -> Option<Instant> {
        Some(self.valid_until)
    }

    async fn mark_sent(&mut self, seqs: &[i64]) -> Result<()> {
        let seqs = checked_seqs(&self.records, seqs.iter().copied())?;
        if !seqs.is_empty() {
            self.marks.push(Mark::Sent(seqs));
        }
        Ok(())
    }

    async fn mark_suspect(&mut self, seqs: &[i64], reason: &str) -> Result<()> {
        let seqs = checked_seqs(&self.records, seqs.iter().copied())?;
        if !seqs.is_empty() {
            self.marks.push(Mark::Suspect {
                seqs,
                reason: reason.to_owned(),
            });
        }
        Ok(())
    }

    async fn mark_failed(&mut self, failures: &[FailedAttempt]) -> Result<()> {
        let seqs = checked_seqs(&self.records, failures.iter().map(|f| f.seq))?;
        if seqs.is_empty() {
            return Ok(());
        }
        let rows: Vec<serde_json::Value> = failures
            .iter()
            .map(|f| {
                json!([
                    f.seq,
                    f.next.transition().to().as_str(),
                    i32::try_from(f.attempts).unwrap_or(i32::MAX),
                    f.next.next_attempt_at().map(micros),
                    f.error,
                    f.unroutable_since.map(micros),
                    normalize_error(&f.error),
                ])
            })
            .collect();
        // In ordered mode the window's later events of a failed one's
        // aggregate are held behind it (later ones by the claims that see
        // them).
        let mut held = Vec::new();
        if self.order != DeliveryOrder::Unordered {
            for &seq in &seqs {
                if let Some(slot) = self.window.iter().find(|slot| slot.seq == seq) {
                    held.extend(followers(&self.window, seq, &slot.aggregate));
                }
            }
            held.sort_unstable();
            held.dedup();
        }
        self.marks.push(Mark::Failed {
            seqs,
            rows: serde_json::Value::from(rows).to_string(),
            held,
        });
        Ok(())
    }

    async fn finish(mut self) -> Result<()> {
        let lost = self.apply().await?;
        self.finished = true;
        if lost.is_empty() {
            Ok(())
        } else {
            tracing::warn!(
                ?lost,
                "outbox: a claim's lease expired and its events were claimed again"
            );
            Err(Error::LeaseLost { seqs: lost })
        }
    }
}

impl Drop for SqliteClaim {
    /// Clears the claim's leases in the background (best effort; otherwise
    /// they lapse at `lease_until`), so its unmarked rows are claimed again
    /// at once.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.pool.clone();
        let sql = Arc::clone(&self.sql);
        let token = std::mem::take(&mut self.token);
        runtime.spawn(async move {
            if let Ok(mut conn) = pool.get().await {
                let released = diesel::sql_query(&sql.release_lease)
                    .bind::<Text, _>(token)
                    .execute(&mut *conn)
                    .await;
                if let Err(error) = released {
                    tracing::warn!(%error, "outbox: could not clear a dropped claim's leases");
                }
            }
        });
    }
}
