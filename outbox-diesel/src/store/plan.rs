//! Choosing what an ordered claim takes, from a window of candidate rows.
//!
//! The claim reads the first `window` due, unsent rows in `seq` order
//! (without locking), with a flag per row saying whether an earlier event of
//! its aggregate is `Dead` or waits for a retry. [`plan`] picks, per
//! aggregate, the run of rows starting at its first row in the window, unless
//! that row is blocked. The claim then locks the plan with
//! `FOR UPDATE SKIP LOCKED` and [`keep_locked_prefixes`] keeps, per
//! aggregate, only the rows up to the first one it could not lock (held by
//! another relay, or changed since the window was read), so an aggregate's
//! events are never taken with a gap.

use std::collections::{HashMap, HashSet};

/// A candidate row of the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) seq: i64,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    /// An earlier event of this aggregate is dead or waiting for a retry.
    pub(crate) blocked: bool,
}

/// The sequence numbers to lock, in `seq` order, at most `limit`.
pub(crate) fn plan(window: &[Candidate], limit: usize) -> Vec<i64> {
    let mut open: HashMap<(&str, &str), bool> = HashMap::new();
    let mut chosen = Vec::new();
    for row in window {
        if chosen.len() >= limit {
            break;
        }
        let key = (row.aggregate_type.as_str(), row.aggregate_id.as_str());
        let taking = *open.entry(key).or_insert(!row.blocked);
        if taking {
            chosen.push(row.seq);
        }
    }
    chosen
}

/// Of the `planned` rows, the ones to keep given the `locked` ones: per
/// aggregate, the planned rows before its first planned row that was not
/// locked. `key_of` gives a planned row's aggregate.
pub(crate) fn keep_locked_prefixes<'a>(
    planned: &[i64],
    locked: &HashSet<i64>,
    key_of: impl Fn(i64) -> Option<(&'a str, &'a str)>,
) -> HashSet<i64> {
    let mut cut: HashSet<(&str, &str)> = HashSet::new();
    let mut keep = HashSet::new();
    for &seq in planned {
        let Some(key) = key_of(seq) else { continue };
        if cut.contains(&key) {
            continue;
        }
        if locked.contains(&seq) {
            keep.insert(seq);
        } else {
            cut.insert(key);
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, id: &str, blocked: bool) -> Candidate {
        Candidate {
            seq,
            aggregate_type: "order".into(),
            aggregate_id: id.into(),
            blocked,
        }
    }

    #[test]
    fn takes_runs_of_unblocked_aggregates_in_seq_order() {
        let window = [
            row(1, "a", false),
            row(2, "b", true),
            row(3, "a", false),
            row(4, "b", true),
            row(5, "c", false),
        ];
        assert_eq!(plan(&window, 10), [1, 3, 5]);
        assert_eq!(plan(&window, 2), [1, 3]);
        assert!(plan(&window, 0).is_empty());
    }

    #[test]
    fn an_unlocked_row_cuts_the_rest_of_its_aggregate() {
        let window = [
            row(1, "a", false),
            row(2, "b", false),
            row(3, "a", false),
            row(4, "b", false),
            row(5, "a", false),
        ];
        let planned = plan(&window, 10);
        // Row 3 was locked by someone else: a keeps 1 only; b keeps both.
        let locked: HashSet<i64> = [1, 2, 4, 5].into();
        let by_seq: HashMap<i64, &Candidate> = window.iter().map(|c| (c.seq, c)).collect();
        let keep = keep_locked_prefixes(&planned, &locked, |seq| {
            by_seq
                .get(&seq)
                .map(|c| (c.aggregate_type.as_str(), c.aggregate_id.as_str()))
        });
        let mut keep: Vec<i64> = keep.into_iter().collect();
        keep.sort();
        assert_eq!(keep, [1, 2, 4]);
    }
}
