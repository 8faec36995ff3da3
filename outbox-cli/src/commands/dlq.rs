//! `outbox dlq list|show|groups|replay|purge`: consumers' dead letters.
//!
//! Listing reads the records the consumers wrote in the database
//! (`inbox_dead_letters`), never the broker's queue: getting and requeueing
//! messages would reorder them (or drop them, on some queue types). Replay
//! and purge act on the dead-letter queue in RabbitMQ and mark the records,
//! through `outbox_core::admin::DeadLetters` (as the admin router does).

use crate::backend::AnyDeadLetters;
use outbox_core::admin::{
    AdminError, DeadLetterQuery, DeadLetterRecord, DeadLetters, DlqPurge, DlqReplay, StopCause,
};
use outbox_lapin::{AmqpUrls, DeadLetterQueues};

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
    let mut query = DeadLetterQuery::new()
        .after(args.after)
        .limit(args.limit)
        .include_settled(args.all);
    if let Some(queue) = &args.queue {
        query = query.queue(queue);
    }
    let page = ctx.verbs(None).list(&query).await?;
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
    let r = ctx.verbs(None).show(id).await?;
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
    let groups = ctx.verbs(None).groups(queue).await?;
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

/// `--amqp-url` or `AMQP_URL`; one that names no URL (empty, or only
/// commas and spaces such as `","`) is missing too.
fn amqp_url(global: &Global) -> Result<&str> {
    global
        .amqp_url
        .as_deref()
        .filter(|u| !AmqpUrls::from(*u).is_empty())
        .ok_or(Error::NoAmqpUrl)
}

impl Context {
    /// The dead-letter verbs over the database's records and the broker at
    /// `amqp_url` (listing never connects to it).
    fn verbs(&self, amqp_url: Option<&str>) -> DeadLetters<AnyDeadLetters, DeadLetterQueues> {
        DeadLetters::new(
            self.dead_letters.clone(),
            DeadLetterQueues::new(amqp_url.unwrap_or_default()),
        )
        .chunk_size(self.chunk_size)
    }
}

/// A broker that cannot be reached is exit code 6, as everywhere.
fn classify(error: AdminError) -> Error {
    match error {
        AdminError::Broker(e) => match e.downcast::<outbox_lapin::Error>() {
            Ok(e) => match *e {
                e @ (outbox_lapin::Error::Connect { .. }
                | outbox_lapin::Error::ConnectTimeout { .. }
                | outbox_lapin::Error::Unreachable { .. }) => Error::AmqpConnect(e),
                e => Error::Broker(e),
            },
            Err(e) => Error::Admin(AdminError::Broker(e)),
        },
        e => Error::Admin(e),
    }
}

async fn replay(global: &Global, out: Output, args: &DlqReplayArgs) -> Result<()> {
    let queue = args.queue.as_str();
    let url = amqp_url(global)?;
    let ctx = Context::connect(global, out).await?;
    let verbs = ctx.verbs(Some(url));
    let request = DlqReplay::new(queue).skip_unreplayable(args.skip_unreplayable);
    let mut counting = request.clone().dry_run(true);
    if let Some(limit) = args.limit {
        counting = counting.limit(limit);
    }
    let counted = verbs
        .replay(&ctx.caller, &counting, &|_| {})
        .await
        .map_err(classify)?;
    let total = args.limit.map_or(counted.depth, |l| {
        u64::try_from(l).unwrap_or(u64::MAX).min(counted.depth)
    });
    if args.dry_run {
        if out.json {
            return out.json(&counted);
        }
        return output::line(&format!(
            "dry run: `{queue}` holds {} message(s); nothing replayed",
            counted.depth
        ));
    }
    if total == 0 {
        if out.json {
            return out.json(&counted);
        }
        return output::line(&format!("`{queue}` is empty: nothing to replay"));
    }
    if total > 1 {
        ctx.confirm_text(
            &format!("dlq replay `{queue}`"),
            &format!("{total} message(s): each goes back to its queue and is handled again"),
        )?;
    }
    // Exactly what was confirmed, whatever arrives meanwhile.
    let request = request.limit(usize::try_from(total).unwrap_or(usize::MAX));
    let bar = out.bar(total, "replayed");
    let outcome = verbs
        .replay(&ctx.caller, &request, &|n| bar.set_position(n))
        .await
        .map_err(classify);
    bar.finish_and_clear();
    let outcome = outcome?;
    let report = &outcome.report;
    if out.json {
        out.json(&outcome)?;
    } else {
        output::line(&format!(
            "dlq replay: {} message(s) from `{queue}` sent back to their queue; {} record(s) \
             marked replayed{}{}",
            report.replayed,
            outcome.marked,
            if report.skipped.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} message(s) that cannot go back moved to the tail of `{queue}`",
                    report.skipped.len()
                )
            },
            audit_suffix(outcome.audit_id)
        ))?;
        for skipped in &report.skipped {
            output::warn(&format!(
                "skipped {}: {}",
                skipped
                    .message_id
                    .as_deref()
                    .unwrap_or("a message without message_id"),
                skipped.reason
            ))?;
        }
    }
    let Some(error) = &report.error else {
        return Ok(());
    };
    let next = match report.stopped_by {
        Some(StopCause::Unreplayable) => format!(
            "fix the cause and run `outbox dlq replay {queue}` again (--skip-unreplayable moves \
             messages that cannot go back aside)"
        ),
        Some(StopCause::Store) => "the messages went back; their records are still listed open \
                                   (`outbox dlq list`)"
            .to_owned(),
        _ => format!("when the broker is back, run `outbox dlq replay {queue}` again"),
    };
    Err(Error::ReplayStopped(format!(
        "the replay stopped after {} message(s): {error}. Nothing was lost: the rest is still \
         in `{queue}`; {next}",
        report.handled()
    )))
}

async fn purge(global: &Global, out: Output, args: &DlqPurgeArgs) -> Result<()> {
    let queue = args.queue.as_str();
    if args.origins.is_empty() && !queue.ends_with(".dead") {
        return Err(Error::Invalid(format!(
            "`{queue}` does not end in `.dead`: name each consumer queue that dead-letters into \
             it, whose records to mark purged, with --origin QUEUE"
        )));
    }
    let url = amqp_url(global)?;
    let ctx = Context::connect(global, out).await?;
    let verbs = ctx.verbs(Some(url));
    let request = DlqPurge::new(queue).origins(args.origins.clone());
    let counted = verbs
        .purge(&ctx.caller, &request.clone().dry_run(true))
        .await
        .map_err(classify)?;
    if args.dry_run {
        if out.json {
            return out.json(&counted);
        }
        return output::line(&format!(
            "dry run: `{queue}` holds {} message(s); nothing purged",
            counted.depth
        ));
    }
    ctx.confirm_text(
        &format!("purge `{queue}`"),
        &format!("every message in it ({} now)", counted.depth),
    )?;
    let outcome = verbs.purge(&ctx.caller, &request).await.map_err(classify)?;
    if out.json {
        return out.json(&outcome);
    }
    for warning in &outcome.warnings {
        output::warn(warning)?;
    }
    output::line(&format!(
        "dlq purge: {} message(s) deleted from `{queue}`; {} record(s) of {} marked purged{}",
        outcome.purged,
        outcome.marked,
        outcome
            .origins
            .iter()
            .map(|o| format!("`{o}`"))
            .collect::<Vec<_>>()
            .join(", "),
        audit_suffix(outcome.audit_id)
    ))
}

fn audit_suffix(audit_id: Option<i64>) -> String {
    audit_id
        .map(|id| format!(" (audit #{id})"))
        .unwrap_or_default()
}
