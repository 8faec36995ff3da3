//! `outbox relays list|pause|resume` and `outbox audit`.

use super::Context;
use crate::cli::{AuditArgs, RelaysCommand};
use crate::error::Result;
use crate::output::{self, cut, time};

pub(crate) async fn run(ctx: &Context, cmd: RelaysCommand) -> Result<()> {
    let out = ctx.out;
    let (name, paused) = match cmd {
        RelaysCommand::List => {
            let relays = ctx.admin.relays().await?;
            if out.json {
                return out.json(&relays);
            }
            let mut table = out.table([
                "RELAY",
                "HOST",
                "PID",
                "VERSION",
                "STARTED",
                "HEARTBEAT",
                "IN FLIGHT",
                "LIVE",
                "PAUSED",
            ]);
            for r in &relays {
                table.add_row([
                    r.name.clone(),
                    r.host.clone(),
                    r.pid.to_string(),
                    r.version.clone(),
                    time(r.started_at),
                    time(r.heartbeat_at),
                    r.in_flight.to_string(),
                    r.live.to_string(),
                    r.paused.to_string(),
                ]);
            }
            return output::table(&table);
        }
        RelaysCommand::Pause { name } => (name, true),
        RelaysCommand::Resume { name } => (name, false),
    };
    let report = ctx.admin.set_paused(&ctx.caller, &name, paused).await?;
    out.report(&report)
}

pub(crate) async fn audit(ctx: &Context, args: &AuditArgs) -> Result<()> {
    let log = ctx.admin.audit_log(args.before, args.limit).await?;
    let out = ctx.out;
    if out.json {
        return out.json(&log);
    }
    let mut table = out.table([
        "ID", "AT", "IDENTITY", "ACTION", "COUNT", "OUTCOME", "TARGET",
    ]);
    for r in &log {
        table.add_row([
            r.id.to_string(),
            time(r.at),
            r.entry.identity.clone(),
            r.entry.action.clone(),
            r.count.to_string(),
            // No outcome: still running, or its process was killed.
            r.outcome
                .as_deref()
                .map_or_else(|| "unfinished".to_owned(), |o| cut(o, 40)),
            cut(&r.entry.target.to_string(), 80),
        ]);
    }
    output::table(&table)
}
