//! `outbox dead groups`.

use super::Context;
use crate::cli::DeadCommand;
use crate::error::Result;
use crate::output::{self, cut, time};

pub(crate) async fn run(ctx: &Context, cmd: DeadCommand) -> Result<()> {
    match cmd {
        DeadCommand::Groups(filter) => {
            let groups = ctx.admin.failure_groups(&filter.to_filter()).await?;
            let out = ctx.out;
            if out.json {
                return out.json(&groups);
            }
            let mut table = out.table([
                "GROUP",
                "EVENT TYPE",
                "DEAD",
                "RETRY",
                "FIRST SEEN",
                "LAST SEEN",
                "ERROR",
            ]);
            for g in &groups {
                table.add_row([
                    g.id.clone(),
                    g.event_type.clone(),
                    g.dead.to_string(),
                    g.retry.to_string(),
                    time(g.first_seen),
                    time(g.last_seen),
                    cut(&g.error, 80),
                ]);
            }
            output::table(&table)?;
            if groups.is_empty() {
                output::line("no dead or retrying events")?;
            } else {
                output::line("replay a group with: outbox replay --group GROUP")?;
            }
            Ok(())
        }
    }
}
