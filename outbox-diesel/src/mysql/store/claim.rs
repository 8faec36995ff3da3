//! A MariaDB claim: its transaction, how it is taken, and its marks.

use std::sync::Arc;
use std::time::Instant;

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::admin::normalize_error;
use outbox_core::{Claim, Claimed, DeliveryOrder, EventStatus, FailedAttempt, OutboxRecord};
use serde_json::json;

use super::MysqlOutboxStore;
use super::row::{EventRow, PausedRow, SeqRow, WindowRow};
use super::sql::MysqlStoreSql;
use crate::plan::{self, WindowSlot, checked_seqs, followers};
use crate::prepared::PreparedExt;
use crate::{Error, MysqlTransaction, Result};

/// Restores what a claim set for its session, before its connection goes
/// back to the pool.
const CLAIM_END: &str = "SET SESSION idle_transaction_timeout = DEFAULT";

fn seqs_json(seqs: &[i64]) -> String {
    serde_json::Value::from(seqs).to_string()
}

impl MysqlOutboxStore {
    /// `SET`s for the claim's session and its `BEGIN`, in one round trip.
    fn claim_begin(&self) -> String {
        let secs = self.claim_timeout.as_secs_f64().ceil().max(1.0) as u64;
        format!(
            "SET SESSION idle_transaction_timeout = {secs}; \
             SET TRANSACTION ISOLATION LEVEL READ COMMITTED; {}",
            crate::connection::MYSQL_BEGIN
        )
    }

    pub(super) async fn claim_as(
        &self,
        relay: Option<&str>,
        limit: usize,
    ) -> Result<Claimed<MysqlClaim>> {
        // Dropping the transaction (an error below, a dropped claim) closes
        // its connection, which makes MariaDB roll back.
        let mut tx = MysqlTransaction::begin_with(&self.pool, &self.claim_begin()).await?;
        self.check_version(&mut tx).await?;
        let order = self.cached_order(&mut tx).await?;
        if let Some(name) = relay {
            let paused: Vec<PausedRow> = diesel::sql_query(&self.sql.paused)
                .bind::<Text, _>(name)
                .prepared(self.prepare)
                .load(&mut *tx)
                .await?;
            if paused.iter().any(|p| p.paused) {
                tx.commit_then(CLAIM_END).await?;
                return Ok(Claimed::Paused);
            }
        }
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut window = Vec::new();
        let rows: Vec<EventRow> = if order == DeliveryOrder::Unordered {
            let mut rows: Vec<EventRow> = diesel::sql_query(&self.sql.lock_pending)
                .bind::<BigInt, _>(limit_i64)
                .prepared(self.prepare)
                .load(&mut *tx)
                .await?;
            rows.extend(
                diesel::sql_query(&self.sql.lock_retries)
                    .bind::<BigInt, _>(limit_i64)
                    .prepared(self.prepare)
                    .load::<EventRow>(&mut *tx)
                    .await?,
            );
            rows.sort_by_key(|row| row.seq);
            // Rows locked past the limit stay locked, unused, until the
            // claim ends (as on PostgreSQL).
            rows.truncate(limit);
            rows
        } else {
            let size = limit_i64.saturating_mul(self.claim_window as i64);
            let read: Vec<WindowRow> = diesel::sql_query(&self.sql.window)
                .bind::<BigInt, _>(size)
                .bind::<BigInt, _>(size)
                .prepared(self.prepare)
                .load(&mut *tx)
                .await?;
            let free: Vec<i64> = read.iter().filter(|r| !r.blocked).map(|r| r.seq).collect();
            let blocked: Vec<i64> = read.iter().filter(|r| r.blocked).map(|r| r.seq).collect();
            window = read
                .into_iter()
                .map(|r| WindowSlot {
                    seq: r.seq,
                    aggregate: (r.aggregate_type, r.aggregate_id),
                    blocked: r.blocked,
                })
                .collect();
            let mut locked: Vec<EventRow> = if free.is_empty() {
                Vec::new()
            } else {
                diesel::sql_query(&self.sql.lock)
                    .bind::<Text, _>(seqs_json(&free))
                    .bind::<BigInt, _>(limit_i64)
                    .prepared(self.prepare)
                    .load(&mut *tx)
                    .await?
            };
            hold(&self.sql, self.prepare, &mut tx, &blocked).await?;
            let kept = plan::keep_runs(
                window.iter().map(|slot| plan::WindowEntry {
                    aggregate: (slot.aggregate.0.as_str(), slot.aggregate.1.as_str()),
                    blocked: slot.blocked,
                    locked: locked
                        .iter()
                        .position(|row| row.seq == slot.seq)
                        .map(|_| slot.seq),
                }),
                limit,
            );
            locked.retain(|row| kept.binary_search(&row.seq).is_ok());
            locked
        };
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
                        .bind::<Text, _>(&error)
                        .bind::<Text, _>(normalize_error(&error))
                        .bind::<BigInt, _>(seq)
                        .execute(&mut *tx)
                        .await?;
                    diesel::sql_query(&self.sql.kill_attempt)
                        .bind::<BigInt, _>(seq)
                        .bind::<Nullable<Text>, _>(
                            relay.map(str::to_owned).or_else(|| self.relay_name()),
                        )
                        .bind::<Text, _>(&error)
                        .execute(&mut *tx)
                        .await?;
                    if let Some(slot) = window.iter().find(|slot| slot.seq == seq) {
                        let behind = followers(&window, seq, &slot.aggregate);
                        hold(&self.sql, self.prepare, &mut tx, &behind).await?;
                        cut.push(slot.aggregate.clone());
                    }
                }
                Err(other) => return Err(other),
            }
        }
        if records.is_empty() {
            // Committed, not rolled back: the claim may have held rows or
            // marked malformed ones dead.
            tx.commit_then(CLAIM_END).await?;
            return Ok(Claimed::Empty);
        }
        Ok(Claimed::Batch(MysqlClaim {
            tx: Some(tx),
            records,
            window,
            order,
            sql: Arc::clone(&self.sql),
            prepare: self.prepare,
            keep_sent: self.keep_sent,
            valid_until: Instant::now() + self.claim_timeout.mul_f64(0.8),
            relay: relay.map(str::to_owned).or_else(|| self.relay_name()),
        }))
    }
}

/// Holds `seqs` (blocked events) that no other claim holds locked, if an
/// earlier event of their aggregate is still `retry` or `dead`.
async fn hold(
    sql: &MysqlStoreSql,
    prepare: bool,
    conn: &mut AsyncMysqlConnection,
    seqs: &[i64],
) -> Result<()> {
    if seqs.is_empty() {
        return Ok(());
    }
    let free: Vec<SeqRow> = diesel::sql_query(&sql.lock_holdable)
        .bind::<Text, _>(seqs_json(seqs))
        .prepared(prepare)
        .load(&mut *conn)
        .await?;
    if free.is_empty() {
        return Ok(());
    }
    let free: Vec<i64> = free.into_iter().map(|r| r.seq).collect();
    diesel::sql_query(&sql.hold)
        .bind::<Text, _>(seqs_json(&free))
        .prepared(prepare)
        .execute(conn)
        .await?;
    Ok(())
}

/// A batch claimed on MariaDB: its rows stay locked by the claim's
/// transaction until [`finish`](Claim::finish) commits the marks.
pub struct MysqlClaim {
    tx: Option<MysqlTransaction>,
    records: Vec<OutboxRecord>,
    window: Vec<WindowSlot>,
    order: DeliveryOrder,
    sql: Arc<MysqlStoreSql>,
    prepare: bool,
    keep_sent: bool,
    valid_until: Instant,
    relay: Option<String>,
}

impl std::fmt::Debug for MysqlClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlClaim")
            .field("records", &self.records.len())
            .field("order", &self.order)
            .field("open", &self.tx.is_some())
            .finish_non_exhaustive()
    }
}

impl MysqlClaim {
    fn connection(&mut self) -> Result<&mut AsyncMysqlConnection> {
        self.tx.as_deref_mut().ok_or(Error::ClaimFinished)
    }

    fn record(&self, seq: i64) -> Option<&OutboxRecord> {
        self.records
            .binary_search_by_key(&seq, |r| r.seq)
            .ok()
            .and_then(|at| self.records.get(at))
    }

    async fn trim_attempts(&mut self, seqs: &str) -> Result<()> {
        let sql = Arc::clone(&self.sql);
        let prepare = self.prepare;
        diesel::sql_query(&sql.trim_attempts)
            .bind::<Text, _>(seqs)
            .prepared(prepare)
            .execute(self.connection()?)
            .await?;
        Ok(())
    }
}

impl Claim for MysqlClaim {
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
        if seqs.is_empty() {
            return Ok(());
        }
        let json = seqs_json(&seqs);
        // Retries leaving `retry` release the events held behind them; they
        // are marked sent first, so that the release sees them gone.
        let heads = seqs.iter().any(|&seq| {
            self.record(seq)
                .is_some_and(|r| r.status == EventStatus::Retry)
        });
        let failed_before = seqs
            .iter()
            .any(|&seq| self.record(seq).is_some_and(|r| r.last_error.is_some()));
        let sql = Arc::clone(&self.sql);
        let prepare = self.prepare;
        let keep_sent = self.keep_sent;
        let conn = self.connection()?;
        if keep_sent || heads {
            diesel::sql_query(&sql.mark_sent)
                .bind::<Text, _>(&json)
                .prepared(prepare)
                .execute(&mut *conn)
                .await?;
        }
        if heads {
            diesel::sql_query(&sql.release)
                .bind::<Text, _>(&json)
                .prepared(prepare)
                .execute(&mut *conn)
                .await?;
        }
        if !keep_sent {
            if failed_before {
                diesel::sql_query(&sql.delete_attempts)
                    .bind::<Text, _>(&json)
                    .prepared(prepare)
                    .execute(&mut *conn)
                    .await?;
            }
            diesel::sql_query(if heads {
                &sql.delete_sent_any
            } else {
                &sql.delete_sent
            })
            .bind::<Text, _>(&json)
            .prepared(prepare)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    async fn mark_suspect(&mut self, seqs: &[i64], reason: &str) -> Result<()> {
        let seqs = checked_seqs(&self.records, seqs.iter().copied())?;
        if seqs.is_empty() {
            return Ok(());
        }
        let json = seqs_json(&seqs);
        let sql = Arc::clone(&self.sql);
        let prepare = self.prepare;
        let relay = self.relay.clone();
        let conn = self.connection()?;
        diesel::sql_query(&sql.mark_suspect)
            .bind::<Text, _>(&json)
            .bind::<Text, _>(reason)
            .bind::<Text, _>(normalize_error(reason))
            .prepared(prepare)
            .execute(&mut *conn)
            .await?;
        diesel::sql_query(&sql.suspect_attempts)
            .bind::<Nullable<Text>, _>(relay)
            .bind::<Text, _>(reason)
            .bind::<Text, _>(&json)
            .prepared(prepare)
            .execute(&mut *conn)
            .await?;
        self.trim_attempts(&json).await
    }

    async fn mark_failed(&mut self, failures: &[FailedAttempt]) -> Result<()> {
        let seqs = checked_seqs(&self.records, failures.iter().map(|f| f.seq))?;
        if seqs.is_empty() {
            return Ok(());
        }
        let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.naive_utc().format("%Y-%m-%d %H:%M:%S%.6f").to_string())
        };
        let rows: Vec<serde_json::Value> = failures
            .iter()
            .map(|f| {
                json!({
                    "seq": f.seq,
                    "status": f.next.transition().to().as_str(),
                    "attempts": i32::try_from(f.attempts).unwrap_or(i32::MAX),
                    "next": time(f.next.next_attempt_at()),
                    "error": f.error,
                    "unroutable": time(f.unroutable_since),
                    "group": normalize_error(&f.error),
                })
            })
            .collect();
        let rows = serde_json::Value::from(rows).to_string();
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
        let json = seqs_json(&seqs);
        let sql = Arc::clone(&self.sql);
        let prepare = self.prepare;
        let relay = self.relay.clone();
        let conn = self.connection()?;
        diesel::sql_query(&sql.mark_failed)
            .bind::<Text, _>(&rows)
            .prepared(prepare)
            .execute(&mut *conn)
            .await?;
        diesel::sql_query(&sql.failed_attempts)
            .bind::<Nullable<Text>, _>(relay)
            .bind::<Text, _>(&rows)
            .prepared(prepare)
            .execute(&mut *conn)
            .await?;
        hold(&sql, prepare, conn, &held).await?;
        self.trim_attempts(&json).await
    }

    async fn finish(mut self) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx.commit_then(CLAIM_END).await,
            None => Ok(()),
        }
    }
}
