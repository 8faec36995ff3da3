//! The end of a scenario: [`Scenario::verify`] checks every guarantee
//! against the ground truth (the `orders` table), the tap and the inbox
//! consumer's effects, and returns its [`Summary`].

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Scenario;

impl Scenario {
    /// Waits (up to `limit`) until the outbox holds no unsent row, the tap
    /// has received and the inbox consumer has applied every committed
    /// event; then checks every guarantee and prints the scenario's summary
    /// line. Panics, with what is missing, when a guarantee does not hold.
    ///
    /// The checks: every committed event delivered at least once; nothing
    /// delivered that was not committed (`rolled_back` are the ids of
    /// transactions the producers rolled back on purpose); per aggregate,
    /// first deliveries in commit order; each committed event applied
    /// exactly once by the inbox consumer and nothing else applied; no
    /// unsent row left.
    pub async fn verify(
        &self,
        tap: &crate::Tap,
        produced: &crate::Produced,
        limit: Duration,
    ) -> Summary {
        self.verify_with(tap, produced, limit, None).await.0
    }

    /// [`verify`](Self::verify); with `failover` (see
    /// [`Scenario::verify_failover`]), deliveries of events whose commit
    /// may have vanished with the failed primary (acknowledged or of
    /// unknown outcome) are counted rather than failing the check; a
    /// missing inbox effect is counted, not refused, only for an event
    /// first delivered before the primary was killed (its handler may have
    /// committed the effect there, and the message was acknowledged), once
    /// the rest has drained; and effects of lost events are counted.
    /// Returns the summary and what was lost.
    pub(super) async fn verify_with(
        &self,
        tap: &crate::Tap,
        produced: &crate::Produced,
        limit: Duration,
        failover: Option<&Failover>,
    ) -> (Summary, Lost) {
        let lost = failover.map(|f| &f.recorded);
        // Events whose effect may have died with the old primary: first
        // delivered before it was killed (plus the tap's lag, see
        // `Failover::killed_at`).
        let excusable = |first: &HashMap<Uuid, Instant>, id: &Uuid| {
            failover.is_some_and(|f| first.get(id).is_some_and(|at| *at < f.killed_at + TAP_LAG))
        };
        let deadline = Instant::now() + limit;
        // With `lost`: how long to wait for the last effects once nothing
        // else is missing (an effect applied on the old primary is gone).
        let mut effects_since: Option<Instant> = None;
        let mut tap_stalled_since: Option<Instant> = None;
        let mut last_report = Instant::now();
        let committed = loop {
            let state = async {
                let committed = self.committed().await?;
                let unsent = self.unsent().await?;
                let effects = self.effects().await?;
                Ok::<_, String>((committed, unsent, effects))
            }
            .await;
            let pending = match &state {
                Ok((committed, unsent, effects)) => {
                    let received = tap.unique_ids();
                    let missing = committed
                        .iter()
                        .filter(|c| !received.contains(&c.event_id))
                        .count();
                    let unapplied = committed
                        .iter()
                        .filter(|c| !effects.contains_key(&c.event_id))
                        .count();
                    if *unsent == 0 && missing == 0 && unapplied == 0 {
                        break state.map(|(c, _, _)| c).unwrap_or_default();
                    }
                    let all_excusable = || {
                        let first = first_deliveries(tap);
                        committed
                            .iter()
                            .filter(|c| !effects.contains_key(&c.event_id))
                            .all(|c| excusable(&first, &c.event_id))
                    };
                    // Quorum queues on a cluster (RabbitMQ 3.10): the tap
                    // (raw lapin on its own quorum queue) was seen, after a
                    // node stopped, to get nothing more for minutes, fresh
                    // consumers included, while the library's inbox consumer
                    // on its own quorum queue had every event. Nothing is
                    // lost then (every committed event applied, none
                    // unsent): after 30 s, say so loudly and verify the rest
                    // on what the tap has.
                    if self.queue_type == outbox::rabbitmq::QueueType::Quorum
                        && *unsent == 0
                        && unapplied == 0
                        && missing > 0
                    {
                        let since = *tap_stalled_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= Duration::from_secs(30) {
                            tracing::warn!(
                                scenario = %self.name,
                                missing,
                                "the tap's quorum queue delivered nothing for 30 s while the \
                                 inbox consumer applied every committed event: RabbitMQ's \
                                 quorum-queue consumer stall, not a loss; verifying the rest \
                                 on the tap's deliveries"
                            );
                            break state.map(|(c, _, _)| c).unwrap_or_default();
                        }
                    } else {
                        tap_stalled_since = None;
                    }
                    if lost.is_some() && *unsent == 0 && missing == 0 && all_excusable() {
                        let since = *effects_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= Duration::from_secs(10) {
                            break state.map(|(c, _, _)| c).unwrap_or_default();
                        }
                    }
                    format!(
                        "{} committed, {unsent} unsent in the outbox, {missing} not received, \
                         {unapplied} not applied by the inbox consumer",
                        committed.len()
                    )
                }
                Err(e) => format!("database not answering: {e}"),
            };
            if last_report.elapsed() >= Duration::from_secs(5) {
                last_report = Instant::now();
                tracing::info!(scenario = %self.name, "draining: {pending}");
            }
            assert!(
                Instant::now() < deadline,
                "{}: not drained within {limit:?} of verifying ({:.1} s after the last fault): \
                 {pending}",
                self.name,
                self.last_fault().elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let drain = self.last_fault().elapsed();
        // Late duplicates (a publish confirmed after its relay died) would
        // still be in flight; give them a moment to land, then read the
        // effects and the outbox again: the final checks see late ones.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let effects = self
            .effects()
            .await
            .unwrap_or_else(|e| panic!("{}: reading the effects: {e}", self.name));
        let unsent = self
            .unsent()
            .await
            .unwrap_or_else(|e| panic!("{}: reading the outbox: {e}", self.name));
        assert_eq!(
            unsent, 0,
            "{}: unsent rows appeared after draining",
            self.name
        );

        let deliveries = tap.deliveries();
        let committed_ids: HashSet<Uuid> = committed.iter().map(|c| c.event_id).collect();
        let phantom: Vec<&crate::Delivery> = deliveries
            .iter()
            .filter(|d| !committed_ids.contains(&d.id))
            .filter(|d| !lost.is_some_and(|lost| lost.contains(&d.id)))
            .collect();
        let lost_delivered: HashSet<Uuid> = deliveries
            .iter()
            .filter(|d| !committed_ids.contains(&d.id))
            .map(|d| d.id)
            .collect();
        assert!(
            phantom.is_empty(),
            "{}: {} deliveries of events never committed, e.g. {:?}",
            self.name,
            phantom.len(),
            <[_]>::first(&phantom)
        );
        let delivered = tap.unique_ids();
        let rolled_back_delivered = produced
            .rolled_back
            .iter()
            .filter(|id| delivered.contains(id))
            .count();
        assert_eq!(
            rolled_back_delivered, 0,
            "{}: events of rolled-back transactions were delivered",
            self.name
        );
        // Transactions that failed before their COMMIT was sent: rolled
        // back for certain, so never committed nor delivered.
        let failed_committed = produced
            .failed_uncommitted
            .iter()
            .filter(|id| committed_ids.contains(id))
            .count();
        let failed_delivered = produced
            .failed_uncommitted
            .iter()
            .filter(|id| delivered.contains(id))
            .count();
        assert_eq!(
            (failed_committed, failed_delivered),
            (0, 0),
            "{}: events of transactions that failed before their COMMIT were committed or \
             delivered ({} of them in all)",
            self.name,
            produced.failed_uncommitted.len()
        );

        // Per-aggregate order of first deliveries.
        let mut seen = HashSet::new();
        let mut last_seq: HashMap<&str, i32> = HashMap::new();
        let mut duplicates = 0;
        let mut redeliveries = 0;
        for d in &deliveries {
            if !seen.insert(d.id) {
                if d.redelivered {
                    redeliveries += 1;
                } else {
                    duplicates += 1;
                }
                continue;
            }
            if let Some(previous) = last_seq.insert(d.aggregate.as_str(), d.seq) {
                assert!(
                    previous < d.seq,
                    "{}: aggregate {} delivered seq {} after {previous}",
                    self.name,
                    d.aggregate,
                    d.seq
                );
            }
        }

        // Inbox: each committed event applied exactly once, nothing else.
        let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
        assert!(
            twice.is_empty(),
            "{}: {} events applied more than once by the inbox consumer, e.g. {:?}",
            self.name,
            twice.len(),
            <[_]>::first(&twice)
        );
        // With `lost`: an event published from the old primary and gone
        // from the new one may have been applied on the new one (its
        // message handled after the failover): counted, not refused.
        let applied_then_lost = effects
            .keys()
            .filter(|id| !committed_ids.contains(id))
            .filter(|id| lost.is_some_and(|lost| lost.contains(id)))
            .count();
        assert!(
            effects
                .keys()
                .all(|id| committed_ids.contains(id) || lost.is_some_and(|l| l.contains(id))),
            "{}: the inbox consumer applied an event never committed",
            self.name
        );

        let unapplied: Vec<Uuid> = committed
            .iter()
            .filter(|c| !effects.contains_key(&c.event_id))
            .map(|c| c.event_id)
            .collect();
        let first = first_deliveries(tap);
        let inexcusable: Vec<&Uuid> = unapplied
            .iter()
            .filter(|id| !excusable(&first, id))
            .collect();
        assert!(
            inexcusable.is_empty(),
            "{}: {} committed events not applied ({} of them not first delivered before the \
             primary was killed), e.g. {:?}",
            self.name,
            unapplied.len(),
            inexcusable.len(),
            inexcusable.first()
        );
        let unapplied = unapplied.len();
        let summary = Summary {
            scenario: self.name.clone(),
            backend: self.backend.name(),
            events: committed.len(),
            rolled_back: produced.rolled_back.len(),
            failed_transactions: produced.failed,
            faults: self.faults(),
            deliveries: deliveries.len(),
            duplicates,
            redeliveries,
            drain_after_last_fault: drain,
        };
        let line = summary.to_string();
        tracing::info!("{line}");
        // The summary line is the suite's report: shown with --nocapture
        // and kept in the captured output of a failing test.
        #[allow(clippy::print_stdout)]
        {
            println!("{line}");
        }
        let lost = Lost {
            delivered: lost_delivered.len(),
            unapplied,
            applied: applied_then_lost,
        };
        (summary, lost)
    }
}

/// When the tap first received each event.
fn first_deliveries(tap: &crate::Tap) -> HashMap<Uuid, Instant> {
    let mut first = HashMap::new();
    for d in tap.deliveries() {
        first.entry(d.id).or_insert(d.at);
    }
    first
}

/// How late the tap may see a message after the inbox consumer handled it
/// (two queues of one exchange, both consumed at once): an effect applied
/// on the old primary just before it died may reach the tap this much
/// after the kill was recorded. Generous (5 s): the tap is another
/// consumer on a loaded 2-core machine, and a lag beyond the allowance
/// fails the run although nothing is wrong.
const TAP_LAG: Duration = Duration::from_secs(5);

/// What [`Scenario::verify_with`] needs to know of a failover.
#[derive(Debug, Clone)]
pub(super) struct Failover {
    /// Events whose commit may have vanished with the old primary:
    /// acknowledged or of unknown outcome (never those that certainly
    /// rolled back).
    pub(super) recorded: HashSet<Uuid>,
    /// When the old primary was known dead (its `pg_ctl stop` returned):
    /// no effect was applied there after.
    pub(super) killed_at: Instant,
}

/// What [`Scenario::verify_with`] counted of what a failover lost.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lost {
    /// Events delivered that the database does not hold.
    pub(super) delivered: usize,
    /// Events the database holds whose effect is missing.
    pub(super) unapplied: usize,
    /// Effects of events the database does not hold.
    pub(super) applied: usize,
}

/// What a scenario measured; printed as one line.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// The database back end ([`Backend::name`](super::Backend::name)).
    pub backend: &'static str,
    /// Committed events.
    pub events: usize,
    /// Events of transactions rolled back on purpose (never delivered).
    pub rolled_back: usize,
    /// Producer transactions that failed (e.g. the database went away);
    /// their events count as committed only if the `orders` row is there.
    pub failed_transactions: usize,
    /// Faults injected.
    pub faults: usize,
    /// Messages the tap received, duplicates included.
    pub deliveries: usize,
    /// Events published more than once (a relay died between publish and
    /// mark).
    pub duplicates: usize,
    /// Messages the broker delivered again to the tap (flagged
    /// `redelivered`: the tap's own connection was lost before its ack).
    pub redeliveries: usize,
    /// From the last fault until everything was delivered and applied.
    pub drain_after_last_fault: Duration,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FAULT SUMMARY {} on {}: events={} rolled_back={} failed_tx={} faults={} \
             deliveries={} duplicates={} redeliveries={} drain_after_last_fault={:.2}s",
            self.scenario,
            self.backend,
            self.events,
            self.rolled_back,
            self.failed_transactions,
            self.faults,
            self.deliveries,
            self.duplicates,
            self.redeliveries,
            self.drain_after_last_fault.as_secs_f64()
        )
    }
}
