//! `outbox dlq list|show|groups|replay|purge`: consumers' dead letters.
//!
//! Listing reads the records the consumers wrote in the database
//! (`inbox_dead_letters`), never the broker's queue: getting and requeueing
//! messages would reorder them (or drop them, on some queue types). Replay
//! and purge act on the dead-letter queue in RabbitMQ, then mark the records.

use std::collections::BTreeMap;

use outbox_core::admin::{AdminError, AuditEntry, DeadLetterRecord, OutboxAdmin as _};
use outbox_lapin::{DeadLetterQueue, DlqReplayReport};
use serde::Serialize;

use super::Context;
use crate::cli::{DlqCommand, DlqListArgs, DlqPurgeArgs, DlqReplayArgs, Global};
use crate::error::{Error, Result};
use crate::output::{self, Output, cut, opt_time, time};

pub(crate) async fn run(global: &Global, out: Output, cmd: DlqCommand) -> Result<()> {
    match cmd {
        DlqCommand::List(args) => list(&Context::connect(global, out).await?, &args).await,
        DlqCommand::Show { id } => show(&Context::connect(global, out).await?, id).await,
        DlqCommand::Groups { queue } => {
            groups(&Context::connect(global, out).await?, queue.as_deref()).await
        }
        DlqCommand::Replay(args) => replay(global, out, &args).await,
        DlqCommand::Purge(args) => purge(global, out, &args).await,
    }
}

async fn list(ctx: &Context, args: &DlqListArgs) -> Result<()> {
    if !(1..=10_000).contains(&args.limit) {
        return Err(Error::Invalid("--limit must be 1 to 10000".to_owned()));
    }
    let page = ctx
        .dead_letters
        .list(args.queue.as_deref(), args.after, args.limit, args.all)
        .await?;
    let out = ctx.out;
    if out.json {
        return out.json(&page);
    }
    let mut table = out.table([
        "ID",
        "QUEUE",
        "CONSUMER",
        "EVENT TYPE",
        "EVENT ID",
        "ATTEMPTS",
        "DEAD-LETTERED",
        "STATE",
        "REASON",
    ]);
    for r in &page.items {
        let l = &r.letter;
        table.add_row([
            r.id.to_string(),
            l.queue.clone(),
            l.consumer.clone(),
            l.event_type.clone().unwrap_or_default(),
            l.event_id.map(|id| id.to_string()).unwrap_or_default(),
            l.attempts.to_string(),
            time(l.dead_lettered_at),
            state(r).to_owned(),
            cut(&l.reason, 60),
        ]);
    }
    output::table(&table)?;
    match page.next {
        Some(next) => output::line(&format!("next page: --after {next}")),
        None if page.items.is_empty() && !args.all => {
            output::line("no open dead letters (--all shows replayed and purged ones)")
        }
        None => output::line("(last page)"),
    }
}

/// `open`, `replayed` or `purged`.
fn state(r: &DeadLetterRecord) -> &'static str {
    match (r.replayed_at, r.purged_at) {
        (Some(_), _) => "replayed",
        (None, Some(_)) => "purged",
        (None, None) => "open",
    }
}

async fn show(ctx: &Context, id: i64) -> Result<()> {
    let Some(r) = ctx.dead_letters.show(id).await? else {
        return Err(AdminError::NotFound(format!("no dead letter has the id {id}")).into());
    };
    let out = ctx.out;
    if out.json {
        return out.json(&r);
    }
    let l = &r.letter;
    let mut text = String::new();
    let mut field = |name: &str, value: &str| {
        text.push_str(&format!("{name:<16}{value}\n"));
    };
    field("id:", &r.id.to_string());
    field("state:", state(&r));
    field("consumer:", &l.consumer);
    field("queue:", &l.queue);
    field("exchange:", &l.exchange);
    field("routing key:", &l.routing_key);
    field(
        "event id:",
        &l.event_id.map(|id| id.to_string()).unwrap_or_default(),
    );
    field("message id:", l.message_id.as_deref().unwrap_or(""));
    field("event type:", l.event_type.as_deref().unwrap_or(""));
    field("attempts:", &l.attempts.to_string());
    field("dead-lettered:", &time(l.dead_lettered_at));
    field("replayed:", &opt_time(r.replayed_at));
    field("purged:", &opt_time(r.purged_at));
    field("reason:", &l.reason);
    text.push_str("headers:\n");
    for (name, value) in &l.headers {
        text.push_str(&format!("  {name}: {value}\n"));
    }
    text.push_str(if l.payload_truncated {
        "payload (cut at 64 KiB):\n"
    } else {
        "payload:\n"
    });
    text.push_str(&l.payload);
    output::line(&text)
}

async fn groups(ctx: &Context, queue: Option<&str>) -> Result<()> {
    let groups = ctx.dead_letters.groups(queue).await?;
    let out = ctx.out;
    if out.json {
        return out.json(&groups);
    }
    let mut table = out.table([
        "GROUP",
        "CONSUMER",
        "EVENT TYPE",
        "COUNT",
        "FIRST SEEN",
        "LAST SEEN",
        "REASON",
    ]);
    for g in &groups {
        table.add_row([
            g.id.clone(),
            g.consumer.clone(),
            g.event_type.clone().unwrap_or_default(),
            g.count.to_string(),
            time(g.first_seen),
            time(g.last_seen),
            cut(&g.reason, 80),
        ]);
    }
    output::table(&table)?;
    if groups.is_empty() {
        output::line("no open dead letters")?;
    }
    Ok(())
}

/// `--amqp-url` or `AMQP_URL`.
fn amqp_url(global: &Global) -> Result<&str> {
    global
        .amqp_url
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(Error::NoAmqpUrl)
}

/// The dead-letter queue `queue` on the broker.
async fn connect_queue(url: &str, queue: &str) -> Result<DeadLetterQueue> {
    DeadLetterQueue::connect(url, queue)
        .await
        .map_err(|e| match e {
            outbox_lapin::Error::Connect { .. } | outbox_lapin::Error::ConnectTimeout { .. } => {
                Error::AmqpConnect(e)
            }
            e => Error::Broker(e),
        })
}

/// What a dry run found.
#[derive(Debug, Serialize)]
struct Depth<'a> {
    queue: &'a str,
    depth: u32,
    dry_run: bool,
}

async fn dry_run(global: &Global, out: Output, queue: &str, verb: &str) -> Result<()> {
    let dlq = connect_queue(amqp_url(global)?, queue).await?;
    let depth = dlq.depth().await.map_err(Error::Broker)?;
    // The broker closes the connection with the process in any case.
    let _ = dlq.close().await;
    if out.json {
        return out.json(&Depth {
            queue,
            depth,
            dry_run: true,
        });
    }
    output::line(&format!(
        "dry run: `{queue}` holds {depth} message(s); nothing {verb}"
    ))
}

/// What a replay did.
#[derive(Debug, Serialize)]
struct Replayed<'a> {
    queue: &'a str,
    #[serde(flatten)]
    report: &'a DlqReplayReport,
    /// Records marked replayed in the database.
    marked: u64,
    audit_id: Option<i64>,
}

async fn replay(global: &Global, out: Output, args: &DlqReplayArgs) -> Result<()> {
    let queue = args.queue.as_str();
    if args.dry_run {
        return dry_run(global, out, queue, "replayed").await;
    }
    let url = amqp_url(global)?;
    let ctx = Context::connect(global, out).await?;
    let dlq = connect_queue(url, queue).await?;
    let depth = dlq.depth().await.map_err(Error::Broker)?;
    // At most what the queue held at the start: a message that fails again
    // at once comes back to its tail and must not be replayed forever.
    let limit = args.limit.map_or(depth as usize, |l| l.min(depth as usize));
    let total = limit as u64;
    if total > 1 {
        ctx.confirm_text(
            &format!("dlq replay `{queue}`"),
            &format!("{total} message(s): each goes back to its queue and is handled again"),
        )?;
    }
    let bar = out.bar(total, "replayed");
    // In chunks, each marked in the database before the next: killed half
    // way, at most one chunk of replayed messages is still open there.
    let chunk = global.chunk_size.max(1);
    let mut report = DlqReplayReport::default();
    let mut marked = 0;
    loop {
        let left = limit.saturating_sub(report.messages.len());
        if left == 0 {
            break;
        }
        let this = left.min(chunk);
        let done = report.replayed;
        let part = match dlq
            .replay(Some(this), &|n| bar.set_position(done + n))
            .await
        {
            Ok(part) => part,
            Err(e) => {
                report.error = Some(e.to_string());
                break;
            }
        };
        match mark_replayed(&ctx, &part).await {
            Ok(n) => marked += n,
            Err(e) => {
                bar.finish_and_clear();
                output::warn(&format!(
                    "{} message(s) were replayed, but marking the last {} of them in the \
                     database failed: `outbox dlq list` still shows those as open",
                    report.replayed + part.replayed,
                    part.replayed
                ))?;
                return Err(e);
            }
        }
        let finished = part.messages.len() < this;
        report.replayed += part.replayed;
        report.messages.extend(part.messages);
        if part.error.is_some() {
            report.error = part.error;
            break;
        }
        if finished {
            break;
        }
    }
    bar.finish_and_clear();
    let _ = dlq.close().await;

    tracing::info!(
        queue,
        replayed = report.replayed,
        marked,
        stopped = report.error.is_some(),
        "dlq replay"
    );
    let target = serde_json::json!({
        "queue": queue,
        "limit": args.limit,
        "replayed": report.replayed,
        "marked": marked,
        "error": report.error,
    });
    let audit_id = audit(&ctx, "dlq_replay", target).await?;
    if out.json {
        out.json(&Replayed {
            queue,
            report: &report,
            marked,
            audit_id,
        })?;
    } else {
        output::line(&format!(
            "dlq replay: {} message(s) from `{queue}` sent back to their queue; {marked} \
             record(s) marked replayed{}",
            report.replayed,
            audit_suffix(audit_id)
        ))?;
    }
    match &report.error {
        None => Ok(()),
        Some(error) => Err(Error::ReplayStopped(format!(
            "the replay stopped after {} message(s): {error}. Nothing was lost: the rest is \
             still in `{queue}`; fix the cause and run `outbox dlq replay {queue}` again",
            report.replayed
        ))),
    }
}

/// Marks the records of what `report` replayed, per origin queue; returns
/// how many.
async fn mark_replayed(ctx: &Context, report: &DlqReplayReport) -> Result<u64> {
    // Exactly the records of the moved messages, by the id the consumer
    // gave each dead letter; by event id for letters dead-lettered before
    // consumers set it.
    let mut marked = ctx
        .dead_letters
        .mark_replayed_letters(&report.dead_letter_ids())
        .await?;
    let mut by_queue: BTreeMap<&str, Vec<uuid::Uuid>> = BTreeMap::new();
    for m in &report.messages {
        if let (None, Some(id)) = (m.dead_letter_id, m.event_id) {
            by_queue.entry(m.queue.as_str()).or_default().push(id);
        }
    }
    for (origin, ids) in &by_queue {
        marked += ctx.dead_letters.mark_replayed(Some(origin), ids).await?;
    }
    Ok(marked)
}

/// What a purge did.
#[derive(Debug, Serialize)]
struct Purged<'a> {
    queue: &'a str,
    origin: &'a str,
    purged: u64,
    /// Records marked purged in the database.
    marked: u64,
    audit_id: Option<i64>,
}

async fn purge(global: &Global, out: Output, args: &DlqPurgeArgs) -> Result<()> {
    let queue = args.queue.as_str();
    if args.dry_run {
        return dry_run(global, out, queue, "purged").await;
    }
    let Some(origin) = args.origin() else {
        return Err(Error::Invalid(format!(
            "`{queue}` does not end in `.dead`: name the consumer's queue whose records to \
             mark purged with --origin QUEUE"
        )));
    };
    let url = amqp_url(global)?;
    let ctx = Context::connect(global, out).await?;
    let dlq = connect_queue(url, queue).await?;
    let depth = dlq.depth().await.map_err(Error::Broker)?;
    ctx.confirm_text(
        &format!("purge `{queue}`"),
        &format!("every message in it ({depth} now)"),
    )?;
    // Letters recorded after this are still in the queue after the purge.
    let before = ctx.dead_letters.now().await?;
    let purged = dlq.purge().await.map_err(Error::Broker);
    let _ = dlq.close().await;
    let purged = purged?;
    let marked = ctx.dead_letters.mark_purged(origin, before).await?;
    tracing::info!(queue, origin, purged, marked, "dlq purge");
    let target = serde_json::json!({
        "queue": queue,
        "origin": origin,
        "purged": purged,
        "marked": marked,
    });
    let audit_id = audit(&ctx, "dlq_purge", target).await?;
    if out.json {
        return out.json(&Purged {
            queue,
            origin,
            purged,
            marked,
            audit_id,
        });
    }
    output::line(&format!(
        "dlq purge: {purged} message(s) deleted from `{queue}`; {marked} record(s) of \
         `{origin}` marked purged{}",
        audit_suffix(audit_id)
    ))
}

/// Writes the audit row of a finished broker action, its counts in the
/// target (the action is on the broker: nothing else updates the row). A
/// failure is a warning: the action is done.
async fn audit(ctx: &Context, action: &str, target: serde_json::Value) -> Result<Option<i64>> {
    let entry = AuditEntry::new(&ctx.caller.identity, action, target);
    match ctx.admin.store().begin_audit(&entry).await {
        Ok(id) => Ok(Some(id)),
        Err(e) => {
            output::warn(&format!(
                "the {action} is done but its audit row failed: {e}"
            ))?;
            Ok(None)
        }
    }
}

fn audit_suffix(audit_id: Option<i64>) -> String {
    audit_id
        .map(|id| format!(" (audit #{id})"))
        .unwrap_or_default()
}
