//! `outbox events list|show`.

use comfy_table::Cell;
use outbox_core::admin::EventSummary;

use super::Context;
use crate::cli::{EventsCommand, ListArgs, ShowArgs};
use crate::error::Result;
use crate::output::{self, Output, cut, opt_time, time};

pub(crate) async fn run(ctx: &Context, cmd: EventsCommand) -> Result<()> {
    match cmd {
        EventsCommand::List(args) => list(ctx, &args).await,
        EventsCommand::Show(args) => show(ctx, &args).await,
    }
}

async fn list(ctx: &Context, args: &ListArgs) -> Result<()> {
    let page = ctx
        .admin
        .list(&args.filter.to_filter(), args.after, args.limit)
        .await?;
    let out = ctx.out;
    if out.json {
        return out.json(&page);
    }
    output::table(&summaries(out, &page.items))?;
    match page.next {
        Some(next) => output::line(&format!("next page: --after {next}")),
        None => output::line("(last page)"),
    }
}

/// A table of events.
pub(crate) fn summaries(out: Output, items: &[EventSummary]) -> comfy_table::Table {
    let mut table = out.table([
        "SEQ",
        "ID",
        "AGGREGATE",
        "EVENT TYPE",
        "STATUS",
        "ATTEMPTS",
        "OCCURRED",
        "LAST ERROR",
    ]);
    for e in items {
        table.add_row([
            Cell::new(e.seq),
            Cell::new(e.id),
            Cell::new(format!("{}:{}", e.aggregate_type, e.aggregate_id)),
            Cell::new(&e.event_type),
            out.status(e.status),
            Cell::new(e.attempts),
            Cell::new(time(e.occurred_at)),
            Cell::new(cut(e.last_error.as_deref().unwrap_or(""), 60)),
        ]);
    }
    table
}

async fn show(ctx: &Context, args: &ShowArgs) -> Result<()> {
    let mut detail = ctx.admin.show(args.id).await?;
    if !args.payload {
        detail = detail.redacted();
    }
    let out = ctx.out;
    if out.json {
        return out.json(&detail);
    }
    let s = &detail.summary;
    let mut table = out.table(["FIELD", "VALUE"]);
    let rows: Vec<(&str, String)> = vec![
        ("id", s.id.to_string()),
        ("seq", s.seq.to_string()),
        (
            "aggregate",
            format!("{}:{}", s.aggregate_type, s.aggregate_id),
        ),
        (
            "aggregate version",
            detail
                .aggregate_version
                .map(|v| v.to_string())
                .unwrap_or_default(),
        ),
        ("event type", s.event_type.clone()),
        ("schema version", detail.schema_version.to_string()),
        ("status", s.status.to_string()),
        ("attempts", s.attempts.to_string()),
        ("suspect count", s.suspect_count.to_string()),
        ("occurred at", time(s.occurred_at)),
        ("next attempt at", opt_time(s.next_attempt_at)),
        ("unroutable since", opt_time(s.unroutable_since)),
        ("published at", opt_time(s.published_at)),
        ("last error", s.last_error.clone().unwrap_or_default()),
        ("group", detail.group.clone().unwrap_or_default()),
    ];
    for (field, value) in rows {
        table.add_row([field.to_owned(), value]);
    }
    output::table(&table)?;
    if !detail.history.is_empty() {
        let mut history = out.table(["AT", "RELAY", "OUTCOME", "ERROR"]);
        for a in &detail.history {
            history.add_row([
                time(a.at),
                a.relay.clone().unwrap_or_default(),
                a.outcome.as_str().to_owned(),
                a.error.clone(),
            ]);
        }
        output::table(&history)?;
    }
    if args.payload {
        let payload = serde_json::to_string_pretty(&detail.payload).unwrap_or_default();
        let headers = serde_json::to_string_pretty(&detail.headers).unwrap_or_default();
        output::line(&format!("payload:\n{payload}\nheaders:\n{headers}"))?;
    }
    Ok(())
}
