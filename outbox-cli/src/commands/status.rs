//! `outbox status`.

use comfy_table::Cell;
use outbox_core::EventStatus;

use super::Context;
use crate::error::Result;
use crate::output::{self, age, time};

const STATUSES: [EventStatus; 6] = [
    EventStatus::Pending,
    EventStatus::Retry,
    EventStatus::Held,
    EventStatus::Dead,
    EventStatus::Sent,
    EventStatus::Skipped,
];

pub(crate) async fn status(ctx: &Context) -> Result<()> {
    let report = ctx.admin.status().await?;
    let out = ctx.out;
    if out.json {
        return out.json(&report);
    }
    let mut counts = out.table(["STATUS", "EVENTS"]);
    for status in STATUSES {
        let n = report.counts.get(status);
        let estimated =
            report.counts.estimated && matches!(status, EventStatus::Sent | EventStatus::Skipped);
        counts.add_row([
            out.status(status),
            Cell::new(if estimated {
                format!("~{n}")
            } else {
                n.to_string()
            }),
        ]);
    }
    output::table(&counts)?;
    let oldest = report
        .oldest_unsent_age_seconds
        .map_or_else(|| "none".to_owned(), age);
    output::line(&format!(
        "oldest unsent: {oldest}\nblocked aggregates: {}\nunroutable: {}\ndelivery order: {}",
        report.blocked_aggregates,
        report.unroutable,
        serde_json::to_value(report.delivery_order)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    ))?;
    if !report.by_event_type.is_empty() {
        let mut types = out.table(["EVENT TYPE", "PENDING", "RETRY", "HELD", "DEAD"]);
        for t in &report.by_event_type {
            types.add_row([
                t.event_type.clone(),
                t.counts.pending.to_string(),
                t.counts.retry.to_string(),
                t.counts.held.to_string(),
                t.counts.dead.to_string(),
            ]);
        }
        output::table(&types)?;
    }
    if !report.relays.is_empty() {
        let mut relays = out.table(["RELAY", "HOST", "LIVE", "PAUSED", "HEARTBEAT"]);
        for r in &report.relays {
            relays.add_row([
                r.name.clone(),
                r.host.clone(),
                r.live.to_string(),
                r.paused.to_string(),
                time(r.heartbeat_at),
            ]);
        }
        output::table(&relays)?;
    }
    Ok(())
}
