//! `outbox migrate|ddl|explain-claim`.

use serde_json::json;

use super::{Context, database_url};
use crate::cli::{ExplainArgs, Global, MigrateArgs};
use crate::error::{Error, Result};
use crate::output::{self, Output};

pub(crate) async fn migrate(global: &Global, out: Output, args: &MigrateArgs) -> Result<()> {
    let url = database_url(global)?;
    let mut conn = outbox_diesel::connect(url).await.map_err(Error::Connect)?;
    let mut applied = outbox_diesel::migrate(&mut conn, &global.schema).await?;
    if args.contract {
        applied.extend(outbox_diesel::migrate_contract(&mut conn, &global.schema).await?);
    }
    if out.json {
        return out.json(&json!({ "schema": global.schema, "applied": applied }));
    }
    if applied.is_empty() {
        output::line(&format!("schema {:?} is up to date", global.schema))
    } else {
        let list: Vec<String> = applied.iter().map(i32::to_string).collect();
        output::line(&format!(
            "schema {:?}: applied migration(s) {}",
            global.schema,
            list.join(", ")
        ))
    }
}

pub(crate) fn ddl(global: &Global, out: Output) -> Result<()> {
    let sql = outbox_diesel::ddl(&global.schema)?;
    if out.json {
        return out.json(&json!({ "schema": global.schema, "sql": sql }));
    }
    output::line(&sql)
}

pub(crate) async fn explain_claim(ctx: &Context, args: &ExplainArgs) -> Result<()> {
    let plan = ctx.admin.store().explain_claim(args.limit).await?;
    // The plan is JSON either way: PostgreSQL's own format.
    ctx.out.json(&plan)
}
