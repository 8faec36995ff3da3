//! A claim: its transaction (begun as every claim begins it) and
//! [`PgClaim`], the claimed batch marked sent, suspect or failed and
//! finished in it, holding the followers of failed events.

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::admin::normalize_error;
use outbox_core::{Claim, Claimed, DeliveryOrder, FailedAttempt, OutboxRecord};

use super::PgOutboxStore;
use super::pick::ClaimedRows;
use crate::PgTransaction;
pub(super) use crate::plan::{WindowSlot, checked_seqs, followers};
use crate::prepared::PreparedExt;
use crate::sql::{CLAIM_BEGIN, StoreSql};
use crate::{Error, Result};

impl PgOutboxStore {
    /// A claim for the relay named `relay` (or for no relay: a pause
    /// counts for nothing).
    pub(super) async fn claim_as(
        &self,
        relay: Option<&str>,
        limit: usize,
    ) -> Result<Claimed<PgClaim>> {
        // Dropping the transaction (an error below, or the relay dropping
        // the claim) closes its connection, which makes PostgreSQL roll back.
        let mut tx = PgTransaction::begin_with(&self.pool, CLAIM_BEGIN).await?;
        let ClaimedRows {
            order,
            paused,
            records,
            window,
        } = self.claim_rows(&mut tx, limit, relay).await?;
        if records.is_empty() {
            // Committed, not rolled back: the claim may have held rows
            // behind blocked events or marked malformed ones dead.
            tx.commit().await?;
            return Ok(if paused {
                Claimed::Paused
            } else {
                Claimed::Empty
            });
        }
        Ok(Claimed::Batch(PgClaim {
            tx: Some(tx),
            records,
            window,
            order,
            sql: Arc::clone(&self.sql),
            prepare: self.prepare,
            valid_until: Instant::now() + self.claim_timeout.mul_f64(0.8),
            relay: relay.map(str::to_owned).or_else(|| self.relay_name()),
        }))
    }
}

/// Marks `seqs` held, those still pending and not locked by another claim
/// (a claim holds those when it next sees them), in `conn`'s transaction
/// and after the event that holds them back became `retry` or `dead` in it.
pub(super) async fn hold(
    sql: &StoreSql,
    prepare: bool,
    conn: &mut AsyncPgConnection,
    seqs: Vec<i64>,
) -> Result<()> {
    if !seqs.is_empty() {
        diesel::sql_query(&sql.hold)
            .bind::<Array<BigInt>, _>(seqs)
            .prepared(prepare)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// A batch held by one relay: an open transaction with the rows locked.
///
/// Dropped without [`finish`](Claim::finish), its [`PgTransaction`] closes
/// its connection rather than returning it to the pool, so PostgreSQL rolls
/// back and the rows are claimable again at once.
///
/// Each mark ([`mark_sent`](Claim::mark_sent),
/// [`mark_suspect`](Claim::mark_suspect), [`mark_failed`](Claim::mark_failed))
/// names events by their `seq`, each one of [`records`](Claim::records) and
/// at most once per call: a seq of no record of this claim is refused with
/// [`Error::NotInClaim`], a seq named twice in one call with
/// [`Error::DuplicateSeq`], and either way nothing of that mark is changed
/// (the claim stays usable). Different calls may name the same seq (the
/// relay marks an event suspect, then failed).
pub struct PgClaim {
    tx: Option<PgTransaction>,
    records: Vec<OutboxRecord>,
    /// The ordered claim's window (empty when unordered).
    window: Vec<WindowSlot>,
    order: DeliveryOrder,
    sql: Arc<StoreSql>,
    /// Keep the statements prepared on the connection.
    prepare: bool,
    valid_until: Instant,
    /// The relay whose attempts this claim records.
    relay: Option<String>,
}

impl std::fmt::Debug for PgClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClaim")
            .field("records", &self.records.len())
            .field("order", &self.order)
            .field("open", &self.tx.is_some())
            .finish_non_exhaustive()
    }
}

impl PgClaim {
    fn connection(&mut self) -> Result<&mut AsyncPgConnection> {
        self.tx.as_deref_mut().ok_or(Error::ClaimFinished)
    }

    /// `seqs`, checked as [`checked_seqs`] checks them.
    fn seqs(&self, seqs: impl Iterator<Item = i64>) -> Result<Vec<i64>> {
        checked_seqs(&self.records, seqs)
    }
}

impl Claim for PgClaim {
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
        // Events held behind a sent retry are released by the table's
        // trigger, in this transaction (see the module docs).
        let seqs = self.seqs(seqs.iter().copied())?;
        let sql = Arc::clone(&self.sql);
        diesel::sql_query(&sql.mark_sent)
            .bind::<Array<BigInt>, _>(seqs)
            .prepared(self.prepare)
            .execute(self.connection()?)
            .await?;
        Ok(())
    }

    async fn mark_suspect(&mut self, seqs: &[i64], reason: &str) -> Result<()> {
        let seqs = self.seqs(seqs.iter().copied())?;
        let sql = Arc::clone(&self.sql);
        diesel::sql_query(&sql.mark_suspect)
            .bind::<Array<BigInt>, _>(seqs)
            // PostgreSQL text cannot hold NUL.
            .bind::<Text, _>(reason.replace('\0', "\u{FFFD}"))
            .bind::<Nullable<Text>, _>(self.relay.clone())
            .bind::<Text, _>(normalize_error(reason).replace('\0', "\u{FFFD}"))
            .prepared(self.prepare)
            .execute(self.connection()?)
            .await?;
        Ok(())
    }

    async fn mark_failed(&mut self, failures: &[FailedAttempt]) -> Result<()> {
        let seqs = self.seqs(failures.iter().map(|f| f.seq))?;
        let mut statuses = Vec::with_capacity(failures.len());
        let mut attempts = Vec::with_capacity(failures.len());
        let mut next_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(failures.len());
        let mut errors = Vec::with_capacity(failures.len());
        let mut groups = Vec::with_capacity(failures.len());
        let unroutable: Vec<Option<DateTime<Utc>>> =
            failures.iter().map(|f| f.unroutable_since).collect();
        for failure in failures {
            statuses.push(failure.next.transition().to().as_str());
            attempts.push(i32::try_from(failure.attempts).unwrap_or(i32::MAX));
            next_at.push(failure.next.next_attempt_at());
            // PostgreSQL text cannot hold NUL.
            let error = failure.error.replace('\0', "\u{FFFD}");
            groups.push(normalize_error(&error));
            errors.push(error);
        }
        // In ordered mode the events of the window that follow a failed one
        // in its aggregate are held behind it (later ones are held by the
        // claims that see them).
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
        let sql = Arc::clone(&self.sql);
        let relay = self.relay.clone();
        let prepare = self.prepare;
        let conn = self.connection()?;
        diesel::sql_query(&sql.mark_failed)
            .bind::<Array<BigInt>, _>(seqs)
            .bind::<Array<Text>, _>(statuses)
            .bind::<Array<Integer>, _>(attempts)
            .bind::<Array<Nullable<Timestamptz>>, _>(next_at)
            .bind::<Array<Text>, _>(errors)
            .bind::<Array<Nullable<Timestamptz>>, _>(unroutable)
            .bind::<Nullable<Text>, _>(relay)
            .bind::<Array<Text>, _>(groups)
            .prepared(prepare)
            .execute(&mut *conn)
            .await?;
        hold(&sql, prepare, conn, held).await?;
        Ok(())
    }

    async fn finish(mut self) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx.commit().await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::EventEnvelope;

    use outbox_core::testing::TestEvent;

    use super::*;

    fn records(seqs: &[i64]) -> Vec<OutboxRecord> {
        seqs.iter()
            .map(|&seq| {
                OutboxRecord::pending(
                    seq,
                    EventEnvelope::from_event(&TestEvent::new("1")).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn seqs_of_the_claim_pass_in_any_order() {
        let records = records(&[3, 5, 9]);
        let seqs = checked_seqs(&records, [9, 3].into_iter()).unwrap();
        assert_eq!(seqs, [9, 3]);
        assert!(
            checked_seqs(&records, std::iter::empty())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_seq_named_twice_is_refused() {
        let records = records(&[3, 5, 9]);
        let err = checked_seqs(&records, [5, 9, 5].into_iter()).unwrap_err();
        assert!(matches!(err, Error::DuplicateSeq { seq: 5 }), "{err:?}");
        assert!(
            err.to_string().contains("seq 5 is named more than once"),
            "{err}"
        );
    }

    #[test]
    fn a_foreign_seq_is_refused() {
        let records = records(&[3, 5, 9]);
        let err = checked_seqs(&records, [3, 4].into_iter()).unwrap_err();
        assert!(matches!(err, Error::NotInClaim { seq: 4 }), "{err:?}");
    }
}
