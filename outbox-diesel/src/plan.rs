//! What an ordered claim keeps of the window it read and locked.
//!
//! The claim's one statement reads the first `window` due, unsent rows in
//! `seq` order, each with a flag saying whether an earlier event of its
//! aggregate is `Dead` or waits for a retry; locks the first `limit`
//! unblocked ones that no other relay holds (`FOR UPDATE SKIP LOCKED`); and
//! returns the whole window with the locked rows. [`keep_runs`] keeps, per
//! aggregate, the locked rows before its first row that is blocked or was
//! not locked (held by another relay, changed since the window was read, or
//! beyond the limit), so an aggregate's events are never taken with a gap
//! and never past an event that holds it back. The same statement marks the
//! blocked rows `held`, which takes them out of later windows.

use std::collections::HashSet;

/// One row of the window: its aggregate, whether it is blocked, and the row
/// itself if the claim locked it.
pub(crate) struct WindowEntry<'a, T> {
    /// Aggregate type and id.
    pub(crate) aggregate: (&'a str, &'a str),
    pub(crate) blocked: bool,
    pub(crate) locked: Option<T>,
}

/// The rows to claim, in window (`seq`) order, at most `limit`.
pub(crate) fn keep_runs<'a, T>(
    window: impl IntoIterator<Item = WindowEntry<'a, T>>,
    limit: usize,
) -> Vec<T> {
    let mut cut: HashSet<(&str, &str)> = HashSet::new();
    let mut keep = Vec::new();
    for entry in window {
        if cut.contains(&entry.aggregate) {
            continue;
        }
        match entry.locked {
            Some(row) if !entry.blocked && keep.len() < limit => keep.push(row),
            _ => {
                cut.insert(entry.aggregate);
            }
        }
    }
    keep
}

/// One row of an ordered claim's window, kept with the claim: its marks
/// hold the window's later events of an aggregate behind a failed one.
#[derive(Debug)]
pub(crate) struct WindowSlot {
    pub(crate) seq: i64,
    /// Aggregate type and id.
    pub(crate) aggregate: (String, String),
    pub(crate) blocked: bool,
}

/// The seqs of `window` after `seq` in `aggregate`.
pub(crate) fn followers(window: &[WindowSlot], seq: i64, aggregate: &(String, String)) -> Vec<i64> {
    window
        .iter()
        .filter(|slot| slot.seq > seq && slot.aggregate == *aggregate)
        .map(|slot| slot.seq)
        .collect()
}

/// `seqs` if each is one of `records` (sorted by seq) and named once: a
/// claim marks only its own rows, each at most once per mark.
pub(crate) fn checked_seqs(
    records: &[outbox_core::OutboxRecord],
    seqs: impl Iterator<Item = i64>,
) -> crate::Result<Vec<i64>> {
    use crate::Error;
    let mut named = vec![false; records.len()];
    seqs.map(|seq| {
        let at = records
            .binary_search_by_key(&seq, |r| r.seq)
            .map_err(|_| Error::NotInClaim { seq })?;
        match named.get_mut(at) {
            Some(seen) if !*seen => {
                *seen = true;
                Ok(seq)
            }
            _ => Err(Error::DuplicateSeq { seq }),
        }
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, blocked: bool, locked: Option<i64>) -> WindowEntry<'_, i64> {
        WindowEntry {
            aggregate: ("order", id),
            blocked,
            locked,
        }
    }

    #[test]
    fn keeps_each_aggregates_locked_run_in_seq_order() {
        let window = [
            entry("a", false, Some(1)),
            entry("b", false, Some(2)),
            entry("a", false, Some(3)),
            entry("c", false, Some(4)),
        ];
        assert_eq!(keep_runs(window, 100), [1, 2, 3, 4]);
        assert!(keep_runs(Vec::<WindowEntry<'_, i64>>::new(), 100).is_empty());
    }

    #[test]
    fn a_row_not_locked_cuts_the_rest_of_its_aggregate() {
        // Row 3 is held by another relay: a keeps 1 only, even though 5
        // was locked; b keeps both.
        let window = [
            entry("a", false, Some(1)),
            entry("b", false, Some(2)),
            entry("a", false, None),
            entry("b", false, Some(4)),
            entry("a", false, Some(5)),
        ];
        assert_eq!(keep_runs(window, 100), [1, 2, 4]);
    }

    #[test]
    fn a_blocked_row_cuts_its_aggregate_from_there_on() {
        // b's head is blocked (an earlier event is dead): nothing of b.
        // a is blocked from its second row on (a retry waits between them).
        let window = [
            entry("a", false, Some(1)),
            entry("b", true, None),
            entry("a", true, None),
            entry("b", true, None),
            entry("c", false, Some(5)),
            entry("a", true, None),
        ];
        assert_eq!(keep_runs(window, 100), [1, 5]);
    }

    #[test]
    fn keeps_at_most_the_limit_and_cuts_what_does_not_fit() {
        // Locked rows past the limit (the retries locked beside the pending
        // ones) end their aggregates' runs.
        let window = [
            entry("a", false, Some(1)),
            entry("b", false, Some(2)),
            entry("a", false, Some(3)),
            entry("c", false, Some(4)),
        ];
        assert_eq!(keep_runs(window, 2), [1, 2]);
    }

    #[test]
    fn rows_past_the_limit_are_not_locked_and_end_their_runs() {
        let window = [
            entry("a", false, Some(1)),
            entry("a", false, Some(2)),
            entry("b", false, None),
            entry("a", false, None),
            entry("b", false, None),
        ];
        assert_eq!(keep_runs(window, 100), [1, 2]);
    }
}
