//! The checked commit's statements ([`commit_top_level`](crate::commit_top_level)).

/// The probe and the `COMMIT`, in one simple-query message (one round
/// trip). In an aborted transaction every statement but `COMMIT`/`ROLLBACK`
/// fails (SQLSTATE 25P02), and PostgreSQL skips the rest of a message after
/// a failed statement: the `COMMIT`, which would have rolled back without
/// an error, never runs.
pub(crate) const PROBE_AND_COMMIT: &str = "SELECT 1; COMMIT";

/// The probe alone: fails inside an aborted transaction, succeeds outside
/// any transaction (after a failed `COMMIT`).
pub(crate) const PROBE: &str = "SELECT 1";
