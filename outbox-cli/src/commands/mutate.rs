//! `outbox replay|skip|retry-now|purge`: audited mutations, chunked, with a
//! dry run and a confirmation for more than one event.

use outbox_core::EventStatus;
use outbox_core::admin::{EventFilter, PurgeTarget};

use super::Context;
use crate::cli::{PurgeCommand, ReplayArgs, RetryNowArgs, SkipArgs};
use crate::error::Result;

pub(crate) async fn replay(ctx: &Context, args: &ReplayArgs) -> Result<()> {
    let mut filter = args.filter.to_filter();
    if !args.ids.is_empty() {
        filter = filter.with_ids(args.ids.iter().copied());
    }
    if args.all_dead {
        filter = filter.with_status(EventStatus::Dead);
    }
    let admin = &ctx.admin;
    if !args.dry_run && !ctx.yes {
        let count = admin.replay(&ctx.caller, &filter, true, &|_| {}).await?;
        ctx.confirm("replay", Some(count.matched))?;
    }
    let bar = ctx.out.progress("replayed");
    let report = admin
        .replay(&ctx.caller, &filter, args.dry_run, &|n| bar.set_position(n))
        .await;
    bar.finish_and_clear();
    ctx.out.report(&report?)
}

pub(crate) async fn skip(ctx: &Context, args: &SkipArgs) -> Result<()> {
    let report = match (&args.id, &args.head) {
        (Some(id), _) => ctx.admin.skip(&ctx.caller, *id, args.dry_run).await?,
        (None, Some((t, i))) => ctx.admin.skip_head(&ctx.caller, t, i, args.dry_run).await?,
        // clap requires one of them.
        (None, None) => {
            return Err(crate::error::Error::Invalid(
                "skip: give --id ID or --head TYPE:ID".to_owned(),
            ));
        }
    };
    ctx.out.report(&report)
}

pub(crate) async fn retry_now(ctx: &Context, args: &RetryNowArgs) -> Result<()> {
    let mut filter: EventFilter = args.filter.to_filter();
    if !args.ids.is_empty() {
        filter = filter.with_ids(args.ids.iter().copied());
    }
    if args.all {
        filter = filter.with_status(EventStatus::Retry);
    }
    let admin = &ctx.admin;
    if !args.dry_run && !ctx.yes {
        let count = admin.retry_now(&ctx.caller, &filter, true, &|_| {}).await?;
        ctx.confirm("retry now", Some(count.matched))?;
    }
    let bar = ctx.out.progress("made due");
    let report = admin
        .retry_now(&ctx.caller, &filter, args.dry_run, &|n| bar.set_position(n))
        .await;
    bar.finish_and_clear();
    ctx.out.report(&report?)
}

pub(crate) async fn purge(ctx: &Context, cmd: PurgeCommand) -> Result<()> {
    let (target, args, what) = match &cmd {
        PurgeCommand::Sent(args) => (PurgeTarget::Sent, args, "purge sent"),
        PurgeCommand::Inbox(args) => (PurgeTarget::Inbox, args, "purge inbox"),
    };
    if !args.dry_run {
        // A purge does not count first (a scan of a large table): always
        // confirm.
        ctx.confirm(what, None)?;
    }
    let bar = ctx.out.progress("purged");
    let report = ctx
        .admin
        .purge(&ctx.caller, target, args.older_than, args.dry_run, &|n| {
            bar.set_position(n);
        })
        .await;
    bar.finish_and_clear();
    ctx.out.report(&report?)
}
