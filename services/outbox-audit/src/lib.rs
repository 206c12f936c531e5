#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! `outbox-audit`: reconciles a deployment of the order service, the WMS and stock consumers
//! and their relays — the business tables, the outboxes and ledgers, the broker's topics, every
//! consumer's inbox and committed offsets — and reports what must never happen: a paid order
//! without exactly one outbound and one reservation, a stock movement or a refund applied
//! twice, an event a consumer moved past without applying, a published event missing from the
//! broker, an aggregate's events out of order, an event unpublished for too long.
//!
//! It changes nothing: read-only database sessions, and on the broker partitions assigned by
//! hand and group offsets fetched without joining or committing.
//!
//! The order of reads makes a live system audit cleanly: committed offsets before inboxes (an
//! offset is committed after its inbox row), ledgers and outboxes before the topics (a row
//! leaves the outbox after the broker acknowledged it).

pub mod broker;
pub mod checks;
pub mod config;
pub mod report;
pub mod states;
pub mod store;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;

pub use config::Config;
pub use report::{Report, Violation};

use checks::{ConsumerView, LedgerView};

/// One consumer of the deployment: its inbox name, where its inbox is, its group and topics.
struct ConsumerSpec<'a> {
    name: &'static str,
    database: &'a sqlx::PgPool,
    group: &'a str,
    aggregates: &'static [&'static str],
    handles: fn(&str) -> bool,
}

/// Runs every check.
///
/// # Errors
/// When a database or the broker cannot be read (the audit could not run; that is not a
/// violation).
pub async fn audit(config: &Config) -> anyhow::Result<Report> {
    let order = store::connect(&config.order_database_url)
        .await
        .context("connect to the order database")?;
    let wms = store::connect(&config.wms_database_url)
        .await
        .context("connect to the WMS database")?;
    let stock = store::connect(&config.stock_database_url)
        .await
        .context("connect to the stock database")?;
    let databases = [("order", &order), ("wms", &wms), ("stock", &stock)];
    let consumers = [
        ConsumerSpec {
            name: event_contracts::order::CONSUMER_NAME,
            database: &order,
            group: &config.order_group,
            aggregates: &event_contracts::order::CONSUMED_AGGREGATES,
            handles: |t| event_contracts::order::versions(t).is_some(),
        },
        ConsumerSpec {
            name: event_contracts::wms::CONSUMER_NAME,
            database: &wms,
            group: &config.wms_group,
            aggregates: &event_contracts::wms::CONSUMED_AGGREGATES,
            handles: |t| event_contracts::wms::versions(t).is_some(),
        },
        ConsumerSpec {
            name: event_contracts::stock::CONSUMER_NAME,
            database: &stock,
            group: &config.stock_group,
            aggregates: &event_contracts::stock::CONSUMED_AGGREGATES,
            handles: |t| event_contracts::stock::versions(t).is_some(),
        },
    ];
    let mut report = Report::default();
    let prefix = config.topic_prefix.as_str();

    // Business tables first: the cross-database checks skip what changed lately.
    let settle = Duration::from_secs(config.settle_s);
    let orders = store::orders(&order, settle).await?;
    let lines = store::order_lines(&order).await?;
    let outbounds = store::outbounds(&wms).await?;
    let reservations = store::reservations(&stock).await?;
    let movements = store::movements(&stock).await?;
    let shipped_lines = store::shipped_lines(&wms).await?;
    report.count("orders", orders.len() as i64);
    report.count(
        "orders_paid",
        orders.iter().filter(|o| o.fulfils).count() as i64,
    );
    report.count(
        "orders_left_out_recent",
        orders.iter().filter(|o| o.recent).count() as i64,
    );
    report.count("outbounds", outbounds.len() as i64);
    report.count("reservations", reservations.len() as i64);
    report.count("stock_movements", movements.len() as i64);
    report
        .violations
        .extend(checks::business(&checks::Business {
            orders: &orders,
            lines: &lines,
            shipped_lines: &shipped_lines,
            outbounds: &outbounds,
            reservations: &reservations,
            movements: &movements,
        }));
    report
        .violations
        .extend(store::stock_arithmetic(&stock).await?);
    report
        .violations
        .extend(store::refund_arithmetic(&order).await?);
    let order_states = store::order_states(&order, settle).await?;
    let outbound_states = store::outbound_states(&wms).await?;
    report.violations.extend(states::check(
        &order_states,
        &outbound_states,
        &reservations,
    ));
    report
        .violations
        .extend(store::channel_refunds_unfinished(&order).await?);
    report
        .violations
        .extend(store::channel_refund_amounts(&order).await?);

    // Topics: every consumed one, its dead-letter topic, and whatever the ledgers name.
    let kafka_config = config
        .security
        .settings(&outbox_kafka::config_arg::pairs(&config.kafka_config))
        .context("Kafka security settings")?;
    // A refused login or certificate would otherwise only show as a broker timeout.
    outbox_kafka::check_connection(
        &config.kafka_brokers,
        &kafka_config,
        config.broker_timeout(),
    )
    .await
    .context("connecting to Kafka")?;
    let broker = broker::Broker::new(
        &config.kafka_brokers,
        &kafka_config,
        config.broker_timeout(),
    );
    let mut ledgers = Vec::new();
    let max_age = Duration::from_secs(config.max_unpublished_age_s);
    for (name, pool) in databases {
        let (unpublished, stale) = store::unpublished(pool, name, max_age).await?;
        report.count(format!("outbox.{name}.unpublished"), unpublished);
        report.violations.extend(stale);
        match store::ledger(pool).await? {
            Some(rows) => {
                report.count(format!("ledger.{name}.events"), rows.len() as i64);
                ledgers.push(LedgerView {
                    database: name.to_owned(),
                    rows,
                });
            }
            None => report.skipped.push(format!(
                "{name}: no outbox_ledger table, so neither its published events nor their order \
                 on the broker are checked (apply migrations/ledger)"
            )),
        }
    }
    let mut wanted: Vec<String> = Vec::new();
    for c in &consumers {
        for a in c.aggregates {
            let t = format!("{prefix}{a}");
            wanted.push(outbox_consumer::dead_letter_topic(&t));
            wanted.push(t);
        }
    }
    for l in &ledgers {
        wanted.extend(l.rows.iter().map(|r| checks::ledger_topic(r, prefix)));
    }
    wanted.sort();
    wanted.dedup();

    let broker_ref = &broker;
    let partitions = blocking(move || broker_ref.partitions(&wanted)).await?;
    let mut views = Vec::new();
    for c in &consumers {
        let topics: Vec<String> = c
            .aggregates
            .iter()
            .map(|a| format!("{prefix}{a}"))
            .collect();
        let mine: BTreeMap<String, i32> = partitions
            .iter()
            .filter(|(t, _)| topics.contains(t))
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        let group = c.group.to_owned();
        let committed = blocking(move || broker_ref.committed(&group, &mine)).await?;
        let (inbox, duplicates) = store::inbox(c.database, c.name).await?;
        report.count(format!("inbox.{}.events", c.name), inbox.len() as i64);
        report.count(format!("inbox.{}.duplicates_absorbed", c.name), duplicates);
        views.push(ConsumerView {
            name: c.name.to_owned(),
            group: c.group.to_owned(),
            topics,
            handles: c.handles,
            committed,
            inbox,
        });
    }
    let parts = &partitions;
    let records = blocking(move || broker_ref.read_all(parts)).await?;
    let cutoff =
        chrono::Utc::now().timestamp_millis() - i64::from(config.inbox_retention_days) * 86_400_000;
    let (counts, violations) = checks::events(&records, &views, &ledgers, prefix, cutoff);
    report.count("broker.topics", partitions.len() as i64);
    report.count("broker.messages", counts.messages);
    report.count("broker.duplicate_messages", counts.broker_duplicates);
    report.count("broker.dead_letters", counts.dead_letters);
    report.count("ledger.published_events_checked", counts.ledger_published);
    for (name, n) in &counts.checked {
        report.count(format!("consumer.{name}.messages_checked"), *n);
    }
    for (name, n) in &counts.ahead {
        report.count(format!("consumer.{name}.messages_ahead"), *n);
    }
    report.violations.extend(violations);
    Ok(report)
}

/// Runs a blocking broker call off the async runtime's workers.
async fn blocking<T: Send>(
    f: impl FnOnce() -> Result<T, broker::BrokerError> + Send,
) -> anyhow::Result<T> {
    Ok(tokio::task::block_in_place(f)?)
}
