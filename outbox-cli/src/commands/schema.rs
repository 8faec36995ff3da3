//! `outbox migrate|ddl|explain-claim`.

use serde_json::json;

use super::{Context, backend_for, connect_error, database_url};
use crate::backend::{AnyStore, Backend};
use crate::cli::{ExplainArgs, Global, MigrateArgs};
use crate::error::{Error, Result};
use crate::output::{self, Output};

pub(crate) async fn migrate(global: &Global, out: Output, args: &MigrateArgs) -> Result<()> {
    let url = database_url(global)?;
    let backend = backend_for(global, url)?;
    if args.contract && backend != Backend::Postgres {
        return Err(Error::Invalid(format!(
            "--contract: {}'s migrations have no contract phase",
            backend.name()
        )));
    }
    let (applied, target) = match backend {
        Backend::Postgres => {
            let mut conn = outbox_diesel::connect(url).await.map_err(connect_error)?;
            let mut applied = outbox_diesel::migrate(&mut conn, &global.schema).await?;
            if args.contract {
                applied.extend(outbox_diesel::migrate_contract(&mut conn, &global.schema).await?);
            }
            (applied, format!("schema {:?}", global.schema))
        }
        Backend::Mysql => {
            let mut conn = outbox_diesel::mysql::connect(url)
                .await
                .map_err(connect_error)?;
            let applied = outbox_diesel::mysql::migrate(&mut conn).await?;
            (applied, "MariaDB database".to_owned())
        }
        Backend::Sqlite => {
            let mut conn = outbox_diesel::sqlite::connect(url)
                .await
                .map_err(connect_error)?;
            let applied = outbox_diesel::sqlite::migrate(&mut conn).await?;
            (applied, "SQLite database".to_owned())
        }
    };
    if out.json {
        return out.json(&match backend {
            Backend::Postgres => json!({ "schema": global.schema, "applied": applied }),
            Backend::Mysql | Backend::Sqlite => json!({ "applied": applied }),
        });
    }
    if applied.is_empty() {
        output::line(&format!("{target} is up to date"))
    } else {
        let list: Vec<String> = applied.iter().map(i32::to_string).collect();
        output::line(&format!(
            "{target}: applied migration(s) {}",
            list.join(", ")
        ))
    }
}

/// The SQL of every migration: PostgreSQL's in `--schema`, unless
/// `DATABASE_URL` names MariaDB (the connection's database) or SQLite.
pub(crate) fn ddl(global: &Global, out: Output) -> Result<()> {
    let backend = match global.database_url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => backend_for(global, url)?,
        None => Backend::Postgres,
    };
    let text = |migrations: &[outbox_diesel::Migration]| {
        migrations
            .iter()
            .map(|m| {
                format!(
                    "-- {} {}\n{}",
                    m.version,
                    m.name,
                    m.sql.replace("{schema}", "")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let sql = match backend {
        Backend::Postgres => outbox_diesel::ddl(&global.schema)?,
        Backend::Mysql => text(outbox_diesel::mysql::MYSQL_MIGRATIONS),
        Backend::Sqlite => text(outbox_diesel::sqlite::SQLITE_MIGRATIONS),
    };
    if out.json {
        return out.json(&json!({ "schema": global.schema, "sql": sql }));
    }
    output::line(&sql)
}

pub(crate) async fn explain_claim(ctx: &Context, args: &ExplainArgs) -> Result<()> {
    let AnyStore::Postgres(store) = ctx.admin.store() else {
        return Err(Error::Invalid(format!(
            "explain-claim shows PostgreSQL's plan; this DATABASE_URL is {}",
            backend_name(ctx.admin.store())
        )));
    };
    let plan = store.explain_claim(args.limit).await?;
    // The plan is JSON either way: PostgreSQL's own format.
    ctx.out.json(&plan)
}

fn backend_name(store: &AnyStore) -> &'static str {
    match store {
        AnyStore::Postgres(_) => Backend::Postgres.name(),
        AnyStore::Mysql(_) => Backend::Mysql.name(),
        AnyStore::Sqlite(_) => Backend::Sqlite.name(),
    }
}
