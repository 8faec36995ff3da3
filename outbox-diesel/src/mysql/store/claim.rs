//! A MariaDB claim: its transaction, how it is taken, and its marks.

use std::sync::Arc;
use std::time::Instant;

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::admin::normalize_error;
use outbox_core::{Claim, Claimed, DeliveryOrder, EventStatus, FailedAttempt, OutboxRecord};
use serde_json::json;

use super::MysqlOutboxStore;
use super::row::{EventRow, IdRow, SeqRow, UnorderedRow, WindowRow};
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
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut window = Vec::new();
        let paused;
        let rows: Vec<EventRow> = if order == DeliveryOrder::Unordered {
            let read: Vec<UnorderedRow> = diesel::sql_query(&self.sql.claim_unordered)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<BigInt, _>(limit_i64)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<BigInt, _>(limit_i64)
                .bind::<BigInt, _>(limit_i64)
                .prepared(self.prepare)
                .load(&mut *tx)
                .await?;
            paused = read.iter().any(|row| row.paused);
            // Rows locked past the limit stay locked, unused, until the
            // claim ends (as on PostgreSQL).
            read.into_iter().filter_map(|row| row.locked).collect()
        } else {
            let size = limit_i64.saturating_mul(self.claim_window as i64);
            let read: Vec<WindowRow> = diesel::sql_query(&self.sql.window)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<BigInt, _>(size)
                .bind::<Nullable<Text>, _>(relay)
                .bind::<BigInt, _>(size)
                .bind::<BigInt, _>(size)
                .prepared(self.prepare)
                .load(&mut *tx)
                .await?;
            paused = read.iter().any(|row| row.paused);
            window = read
                .into_iter()
                .filter_map(|row| row.slot)
                .map(|r| WindowSlot {
                    seq: r.window_seq,
                    aggregate: (r.window_aggregate_type, r.window_aggregate_id),
                    blocked: r.blocked,
                })
                .collect();
            let free: Vec<i64> = window
                .iter()
                .filter(|w| !w.blocked)
                .map(|w| w.seq)
                .collect();
            let blocked: Vec<i64> = window.iter().filter(|w| w.blocked).map(|w| w.seq).collect();
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
                        .any(|row| row.seq == slot.seq)
                        .then_some(slot.seq),
                }),
                limit,
            );
            locked.retain(|row| kept.contains(&row.seq));
            locked
        };
        if paused {
            tx.commit_then(CLAIM_END).await?;
            return Ok(Claimed::Paused);
        }
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
                        .bind::<Nullable<Text>, _>(
                            relay.map(str::to_owned).or_else(|| self.relay_name()),
                        )
                        .bind::<Text, _>(&error)
                        .bind::<BigInt, _>(seq)
                        .execute(&mut *tx)
                        .await?;
                    trim(&self.sql, self.prepare, &mut tx, &seqs_json(&[seq])).await?;
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
            failed: Vec::new(),
            ended: false,
        }))
    }
}

/// Holds `seqs` (blocked events) whose row and a `retry` or `dead` head
/// before it no other transaction holds locked (a head locked elsewhere may
/// be leaving: the row stays pending, and a later claim holds it).
async fn hold(
    sql: &MysqlStoreSql,
    prepare: bool,
    conn: &mut AsyncMysqlConnection,
    seqs: &[i64],
) -> Result<()> {
    if seqs.is_empty() {
        return Ok(());
    }
    let json = seqs_json(seqs);
    let picked: Vec<SeqRow> = diesel::sql_query(&sql.hold_lock)
        .bind::<Text, _>(&json)
        .bind::<Text, _>(&json)
        .prepared(prepare)
        .load(&mut *conn)
        .await?;
    if !picked.is_empty() {
        let picked: Vec<i64> = picked.into_iter().map(|r| r.seq).collect();
        diesel::sql_query(&sql.hold_apply)
            .bind::<Text, _>(seqs_json(&picked))
            .prepared(prepare)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Releases the held events of `aggregates` that nothing holds back any
/// more (what PostgreSQL's trigger does when a head leaves `retry`/`dead`).
pub(super) async fn release(
    sql: &MysqlStoreSql,
    prepare: bool,
    conn: &mut AsyncMysqlConnection,
    aggregates: &[(String, String)],
) -> Result<usize> {
    if aggregates.is_empty() {
        return Ok(0);
    }
    let json = serde_json::Value::from(
        aggregates
            .iter()
            .map(|(t, i)| json!([t, i]))
            .collect::<Vec<_>>(),
    )
    .to_string();
    let picked: Vec<SeqRow> = diesel::sql_query(&sql.release_pick)
        .bind::<Text, _>(json)
        .prepared(prepare)
        .load(&mut *conn)
        .await?;
    release_seqs(sql, prepare, conn, picked).await
}

/// Releases the held events `picked` (locked by a release's pick).
pub(super) async fn release_seqs(
    sql: &MysqlStoreSql,
    prepare: bool,
    conn: &mut AsyncMysqlConnection,
    picked: Vec<SeqRow>,
) -> Result<usize> {
    if picked.is_empty() {
        return Ok(0);
    }
    let picked: Vec<i64> = picked.into_iter().map(|r| r.seq).collect();
    Ok(diesel::sql_query(&sql.release_apply)
        .bind::<Text, _>(seqs_json(&picked))
        .prepared(prepare)
        .execute(conn)
        .await?)
}

/// Keeps the newest `ATTEMPTS_KEPT` attempts of the events `seqs` (JSON).
async fn trim(
    sql: &MysqlStoreSql,
    prepare: bool,
    conn: &mut AsyncMysqlConnection,
    seqs: &str,
) -> Result<()> {
    let old: Vec<IdRow> = diesel::sql_query(&sql.trim_pick)
        .bind::<Text, _>(seqs)
        .prepared(prepare)
        .load(&mut *conn)
        .await?;
    if !old.is_empty() {
        let ids: Vec<i64> = old.into_iter().map(|r| r.id).collect();
        diesel::sql_query(&sql.trim_apply)
            .bind::<Text, _>(seqs_json(&ids))
            .prepared(prepare)
            .execute(conn)
            .await?;
    }
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
    /// Seqs marked failed by this claim: heads, if they are sent later.
    failed: Vec<i64>,
    /// A mark failed and ended the claim (its transaction rolled back).
    ended: bool,
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
        trim(&sql, prepare, self.connection()?, seqs).await
    }
}

impl MysqlClaim {
    /// `result`, after ending the claim if it is an error: a failed
    /// statement may have been a deadlock, after which MariaDB has rolled
    /// the claim's transaction back and later marks would run in autocommit
    /// without its locks. The relay stops at the first error anyway; this
    /// makes every later call `ClaimFinished` for any other caller.
    fn ended_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err()
            && !matches!(
                result,
                Err(Error::NotInClaim { .. } | Error::DuplicateSeq { .. })
            )
        {
            // Dropped, not committed: its connection is closed.
            self.tx = None;
            self.ended = true;
        }
        result
    }
}

impl MysqlClaim {
    async fn mark_sent_in(&mut self, seqs: &[i64]) -> Result<()> {
        let seqs = checked_seqs(&self.records, seqs.iter().copied())?;
        if seqs.is_empty() {
            return Ok(());
        }
        // Retries (as claimed, or failed by this claim) leaving `retry`
        // release the events held behind them, once they are gone.
        let mut heads: Vec<(String, String)> = seqs
            .iter()
            .filter_map(|&seq| self.record(seq).map(|r| (seq, r)))
            .filter(|(seq, r)| r.status == EventStatus::Retry || self.failed.contains(seq))
            .map(|(_, r)| {
                (
                    r.envelope.aggregate_type.clone(),
                    r.envelope.aggregate_id.clone(),
                )
            })
            .collect();
        heads.sort_unstable();
        heads.dedup();
        let sql = Arc::clone(&self.sql);
        let prepare = self.prepare;
        let keep_sent = self.keep_sent;
        let conn = self.connection()?;
        diesel::sql_query(if keep_sent {
            &sql.mark_sent_keep
        } else {
            &sql.mark_sent_delete
        })
        .bind::<Text, _>(seqs_json(&seqs))
        .prepared(prepare)
        .execute(&mut *conn)
        .await?;
        release(&sql, prepare, conn, &heads).await?;
        Ok(())
    }

    async fn mark_suspect_in(&mut self, seqs: &[i64], reason: &str) -> Result<()> {
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

    async fn mark_failed_in(&mut self, failures: &[FailedAttempt]) -> Result<()> {
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
                    "next_attempt_at": time(f.next.next_attempt_at()),
                    "last_error": f.error,
                    "unroutable_since": time(f.unroutable_since),
                    "error_group": normalize_error(&f.error),
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
        self.failed.extend(&seqs);
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
        let result = self.mark_sent_in(seqs).await;
        self.ended_on_error(result)
    }

    async fn mark_suspect(&mut self, seqs: &[i64], reason: &str) -> Result<()> {
        let result = self.mark_suspect_in(seqs, reason).await;
        self.ended_on_error(result)
    }

    async fn mark_failed(&mut self, failures: &[FailedAttempt]) -> Result<()> {
        let result = self.mark_failed_in(failures).await;
        self.ended_on_error(result)
    }

    async fn finish(mut self) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx.commit_then(CLAIM_END).await,
            None if self.ended => Err(Error::NotCommitted {
                reason: "a mark of this claim failed, which ended it: its transaction was \
                         rolled back, none of its marks is stored (its events are claimed \
                         again)"
                    .into(),
                source: None,
            }),
            None => Ok(()),
        }
    }
}
