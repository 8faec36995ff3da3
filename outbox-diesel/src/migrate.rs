//! Running the embedded migrations safely from several instances at once.

use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::schema::{MIGRATIONS, Migration, Phase, Schema, StepKind, version_table_sql};
use crate::{Error, Result};

#[derive(diesel::QueryableByName)]
struct Locked {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    locked: bool,
}

#[derive(diesel::QueryableByName)]
struct Version {
    #[diesel(sql_type = Integer)]
    version: i32,
}

/// Applies the pending embedded [`Phase::Expand`] migrations to `schema`
/// (created if missing) and returns the versions it applied (empty when up
/// to date).
///
/// Safe when several service instances start at once, and on a table with
/// millions of rows while producers and relays run:
/// - migrations are serialized per schema by an advisory lock, so a second
///   caller waits, then finds nothing to do; history is kept in
///   `<schema>.outbox_schema_version`, never in diesel's
///   `__diesel_schema_migrations`;
/// - a migration without `CONCURRENTLY` steps runs in one transaction (it
///   applies whole or not at all);
/// - a migration of an existing table is expand/contract: no table rewrite,
///   constraints swapped `NOT VALID` and validated without blocking writes,
///   each brief table lock bounded by a `lock_timeout` of 5 s and retried,
///   indexes built `CONCURRENTLY` outside a transaction (an invalid index
///   left by an interrupted build is dropped and built again). Until its
///   last step is done the version is not recorded, so an interrupted run
///   is simply run again.
///
/// Steps outside a transaction take a session-level advisory lock, so
/// migrations need a direct connection or session pooling (as `LISTEN`
/// does), not PgBouncer in transaction pooling mode.
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1/app").await?;
/// let applied = outbox_diesel::migrate(&mut conn, "public").await?;
/// println!("applied outbox migrations {applied:?}");
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Config`] for an invalid schema name, [`Error::Database`] if a
/// statement fails (the failing migration is not recorded; its completed
/// steps are idempotent and are redone on the next run).
pub async fn migrate(conn: &mut AsyncPgConnection, schema: &str) -> Result<Vec<i32>> {
    run(conn, schema, Phase::Expand).await
}

/// Applies every pending migration, [`Phase::Contract`] ones included:
/// they remove what only relays of earlier versions use. Run it once every
/// relay on this outbox runs this version (for 0.2: drops
/// `outbox_events_unsent`, which relays before 0.2 scan; until then it only
/// costs each recorded event one more index entry). As [`migrate`]
/// otherwise.
///
/// # Errors
/// As [`migrate`].
pub async fn migrate_contract(conn: &mut AsyncPgConnection, schema: &str) -> Result<Vec<i32>> {
    run(conn, schema, Phase::Contract).await
}

/// How long a migration step may wait for a table lock before it gives up
/// (and is retried): writers queue behind a waiting `ALTER TABLE`, so the
/// wait must stay short.
const LOCK_TIMEOUT: &str = "5s";
/// Tries of a step that timed out waiting for a lock.
const LOCK_TRIES: u32 = 12;

async fn run(conn: &mut AsyncPgConnection, schema: &str, upto: Phase) -> Result<Vec<i32>> {
    let schema = Schema::new(schema)?;
    let done = conn
        .transaction::<_, Error, _>(async |conn| {
            lock_xact(conn, &schema).await?;
            conn.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {};\n{}",
                schema.quoted(),
                version_table_sql(&schema),
            ))
            .await?;
            applied_versions(conn, &schema).await
        })
        .await?;
    // A new outbox has no relay of an earlier version: it gets everything.
    let upto = if done.is_empty() {
        Phase::Contract
    } else {
        upto
    };
    let wanted = |m: &Migration| upto == Phase::Contract || m.phase == Phase::Expand;
    if MIGRATIONS
        .iter()
        .filter(|m| wanted(m))
        .all(|m| done.contains(&m.version))
    {
        return Ok(Vec::new());
    }
    // Held across the steps, including those outside a transaction. Taken
    // by polling, not by waiting in `pg_advisory_lock`: a statement waiting
    // for it would be a transaction that the holder's `CREATE INDEX
    // CONCURRENTLY` waits for in turn (a deadlock).
    loop {
        let locked: Locked = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
            .bind::<BigInt, _>(schema.lock_key())
            .get_result(conn)
            .await?;
        if locked.locked {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let result = apply(conn, &schema, &wanted).await;
    let unlocked = diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(schema.lock_key())
        .execute(conn)
        .await;
    let applied = result?;
    unlocked?;
    Ok(applied)
}

async fn apply(
    conn: &mut AsyncPgConnection,
    schema: &Schema,
    wanted: &impl Fn(&Migration) -> bool,
) -> Result<Vec<i32>> {
    // Another instance may have applied some while this one waited.
    let done = applied_versions(conn, schema).await?;
    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        if done.contains(&migration.version) || !wanted(migration) {
            continue;
        }
        let steps = migration.steps(schema);
        let record = format!(
            "INSERT INTO {} (version, name) VALUES ($1, $2)",
            schema.table("outbox_schema_version")
        );
        if steps.iter().all(|s| s.kind == StepKind::Transaction) {
            // All or nothing, version row included.
            let sql: Vec<&str> = steps.iter().map(|s| s.sql.as_str()).collect();
            with_lock_timeout(conn, &sql, Some((&record, migration))).await?;
        } else {
            for step in &steps {
                match step.kind {
                    StepKind::Concurrently => concurrently(conn, schema, &step.sql).await?,
                    _ => with_lock_timeout(conn, &[&step.sql], None).await?,
                }
            }
            diesel::sql_query(&record)
                .bind::<Integer, _>(migration.version)
                .bind::<Text, _>(migration.name)
                .execute(conn)
                .await?;
        }
        tracing::info!(
            schema = schema.name(),
            version = migration.version,
            name = migration.name,
            "applied outbox migration"
        );
        applied.push(migration.version);
    }
    Ok(applied)
}

/// Serializes the creation of the schema and the version table. A key of
/// its own: waiting for the migrations' key inside a transaction would make
/// that transaction one a `CREATE INDEX CONCURRENTLY` of the holder waits for.
async fn lock_xact(conn: &mut AsyncPgConnection, schema: &Schema) -> Result<()> {
    diesel::sql_query("SELECT pg_advisory_xact_lock($1)")
        .bind::<BigInt, _>(schema.lock_key().wrapping_add(1))
        .execute(conn)
        .await?;
    Ok(())
}

async fn applied_versions(conn: &mut AsyncPgConnection, schema: &Schema) -> Result<Vec<i32>> {
    let rows: Vec<Version> = diesel::sql_query(format!(
        "SELECT version FROM {}",
        schema.table("outbox_schema_version")
    ))
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|v| v.version).collect())
}

/// Whether `error` is PostgreSQL's "canceling statement due to lock timeout".
fn is_lock_timeout(error: &Error) -> bool {
    matches!(
        error,
        Error::Database(diesel::result::Error::DatabaseError(_, info))
            if info.message().contains("lock timeout")
    )
}

/// Runs `sql` (and `record`'s version row, if given) in one transaction in
/// which each lock is waited for at most [`LOCK_TIMEOUT`]: a table lock
/// queued behind a long transaction (an old relay's claim) would stall
/// every producer's insert meanwhile. A lock timeout is retried, the whole
/// transaction, up to [`LOCK_TRIES`] times.
async fn with_lock_timeout(
    conn: &mut AsyncPgConnection,
    sql: &[&str],
    record: Option<(&str, &Migration)>,
) -> Result<()> {
    let mut tries = 0;
    loop {
        tries += 1;
        let result = conn
            .transaction::<_, Error, _>(async |conn| {
                conn.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                    .await?;
                for step in sql {
                    conn.batch_execute(step).await?;
                }
                if let Some((insert, migration)) = record {
                    diesel::sql_query(insert)
                        .bind::<Integer, _>(migration.version)
                        .bind::<Text, _>(migration.name)
                        .execute(conn)
                        .await?;
                }
                Ok(())
            })
            .await;
        match result {
            Err(error) if tries < LOCK_TRIES && is_lock_timeout(&error) => {
                tracing::warn!(
                    tries,
                    "outbox migration step waited too long for a lock; retrying"
                );
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

/// Runs a `CONCURRENTLY` step outside a transaction. An interrupted
/// `CREATE INDEX CONCURRENTLY` leaves an invalid index that `IF NOT EXISTS`
/// would keep: it is dropped first.
async fn concurrently(conn: &mut AsyncPgConnection, schema: &Schema, sql: &str) -> Result<()> {
    if let Some(index) = created_index(sql) {
        #[derive(diesel::QueryableByName)]
        struct Invalid {
            #[diesel(sql_type = diesel::sql_types::Bool)]
            invalid: bool,
        }
        let found: Vec<Invalid> = diesel::sql_query(
            "SELECT NOT i.indisvalid AS invalid FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
        )
        .bind::<Text, _>(schema.name())
        .bind::<Text, _>(index)
        .load(conn)
        .await?;
        if found.iter().any(|f| f.invalid) {
            tracing::warn!(
                index,
                "dropping an invalid index left by an interrupted migration"
            );
            conn.batch_execute(&format!(
                "DROP INDEX CONCURRENTLY IF EXISTS {}",
                schema.table(index)
            ))
            .await?;
        }
    }
    conn.batch_execute(sql).await?;
    Ok(())
}

/// The name of the index a `CREATE INDEX CONCURRENTLY IF NOT EXISTS name`
/// step builds.
fn created_index(sql: &str) -> Option<&str> {
    const CREATE: &str = "CREATE INDEX CONCURRENTLY IF NOT EXISTS ";
    let rest = &sql[sql.find(CREATE)? + CREATE.len()..];
    rest.split_whitespace().next()
}

/// Opens a direct connection to `url` and runs [`migrate`] on it.
///
/// # Errors
/// [`Error::Connect`] if PostgreSQL cannot be reached, else as [`migrate`].
pub async fn migrate_url(url: &str, schema: &str) -> Result<Vec<i32>> {
    let mut conn = crate::connect(url).await?;
    migrate(&mut conn, schema).await
}
