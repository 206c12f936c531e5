//! `outbox-relay debezium-install`: the command around [`install_sql`], and the wait on
//! Debezium's replication slot for the cutover.

use anyhow::Context;
use sqlx::ConnectOptions;

use super::columns::table_columns;
use super::properties::{parse_properties, ConnectProperties};
use super::router::RouterConfig;
use super::sql::{install_sql, trigger_name};
use crate::config::DebeziumInstallArgs;
use crate::store::debezium as store;

/// `outbox-relay debezium-install`: reads the properties, checks the table, installs the
/// trigger (or prints its SQL), then waits on Debezium's slot when asked to.
///
/// # Errors
/// Unreadable or refused properties, the database, a slot that does not confirm in time.
pub async fn install(args: &DebeziumInstallArgs) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for path in &args.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut properties = std::collections::BTreeMap::new();
        parse_properties(&text, &mut properties)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        files.push((path.display().to_string(), properties));
    }
    let config = ConnectProperties::from_files(files)
        .and_then(|layers| RouterConfig::from_connect(&layers))
        .map_err(|e| anyhow::anyhow!("the Debezium configuration: {e}"))?;
    let mut conn = outbox_process::pg::connect_options(&args.db.database_url)
        .context("invalid DATABASE_URL")?
        .connect()
        .await
        .context("connecting to the database")?;
    let (outbox_schema, ready) = store::outbox_schema(&mut conn)
        .await
        .context("reading the outbox's schema")?
        .context(
            "no outbox on the connection's search_path: run `outbox-relay migrate` first, with \
             the same database settings",
        )?;
    anyhow::ensure!(
        ready,
        "no up-to-date outbox in schema {outbox_schema}: run `outbox-relay migrate` first \
         (and keep standard_conforming_strings on)"
    );
    let columns = table_columns(&mut conn, &config.schema, &config.table)
        .await
        .context("reading the table's columns")?
        .with_context(|| format!("no table {}.{}", config.schema, config.table))?;
    let statements = install_sql(&config, &columns, &outbox_schema)
        .map_err(|e| anyhow::anyhow!("the Debezium table: {e}"))?;
    if args.print {
        for s in &statements {
            println!("{s};\n");
        }
        return Ok(());
    }
    store::install_trigger(&mut conn, &statements)
        .await
        .with_context(|| {
            format!(
                "installing the trigger on {}.{}",
                config.schema, config.table
            )
        })?;
    if let Some(slot) = &args.slot {
        wait_for_slot(&mut conn, slot, args.slot_timeout_secs).await?;
    }
    println!(
        "{}.{}: each inserted row is published to Kafka as Debezium's Outbox Event Router would \
         (trigger {}; key {:?}, value {:?})",
        config.schema,
        config.table,
        trigger_name(&config.table),
        config.key_converter,
        config.value_converter
    );
    Ok(())
}

/// Waits until replication slot `slot` confirmed the current WAL position (every transaction
/// committed before now is published by the slot's consumer).
async fn wait_for_slot(
    conn: &mut sqlx::PgConnection,
    slot: &str,
    timeout_secs: u64,
) -> anyhow::Result<()> {
    let lsn = store::current_wal_lsn(conn).await?;
    println!("waiting until slot {slot} confirmed {lsn} (Debezium published every row committed before the trigger)");
    let conn = &tokio::sync::Mutex::new(conn);
    let confirmed = outbox_process::poll::poll_every(
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(timeout_secs),
        || async {
            let mut conn = conn.lock().await;
            let row = store::slot_confirmed(&mut conn, slot, &lsn).await;
            match row {
                Ok(Some((true, _))) => Some(Ok(())),
                Ok(Some(_)) => None,
                Ok(None) => Some(Err(anyhow::anyhow!("no replication slot {slot}"))),
                Err(e) => Some(Err(e.into())),
            }
        },
    )
    .await;
    match confirmed {
        Some(result) => result,
        None => anyhow::bail!(
            "slot {slot} did not confirm {lsn} within {timeout_secs} s: is Debezium running, and \
             are rows (or heartbeats) flowing? The trigger is installed; run again with --slot \
             to wait again"
        ),
    }
}
