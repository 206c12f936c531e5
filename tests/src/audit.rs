//! `outbox-audit` against a [`System`]: installing the producer-side ledgers it reconciles the
//! broker against, running the binary with the system's databases, topics and groups, and
//! reading its JSON report.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::fulfilment::System;
use crate::proc::workspace_binary;

/// Installs the outbox ledger (`migrations/ledger`) in the system's three databases. Call it
/// before the first event is written: events written earlier are not in the ledger.
pub async fn install_ledgers(sys: &System) {
    for db in [&sys.order_db, &sys.wms_db, &sys.stock_db] {
        outbox_writer::schema::migrate_ledger(&db.pool)
            .await
            .expect("install the outbox ledger");
    }
}

/// One run of the audit.
#[derive(Debug, Clone)]
pub struct AuditRun {
    /// The exit code (0 clean, 1 violations, 2 could not audit).
    pub code: i32,
    /// The JSON report (`Null` when it printed none).
    pub report: Value,
    /// What it wrote to stderr.
    pub stderr: String,
}

impl AuditRun {
    /// The violations.
    pub fn violations(&self) -> Vec<Value> {
        self.report["violations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The violations of one kind.
    pub fn of_kind(&self, kind: &str) -> Vec<Value> {
        self.violations()
            .into_iter()
            .filter(|v| v["kind"] == kind)
            .collect()
    }

    /// A count of the report (0 when absent).
    pub fn count(&self, name: &str) -> i64 {
        self.report["counts"][name].as_i64().unwrap_or(0)
    }
}

/// The audit's arguments for `sys` (its databases, brokers, prefix and groups), then `extra`.
pub fn audit_args(sys: &System, brokers: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--order-database-url",
        &sys.order_db.url,
        "--wms-database-url",
        &sys.wms_db.url,
        "--stock-database-url",
        &sys.stock_db.url,
        "--kafka-brokers",
        brokers,
        "--topic-prefix",
        &sys.prefix,
        "--order-group",
        &format!("{}order", sys.prefix),
        "--wms-group",
        &format!("{}wms", sys.prefix),
        "--stock-group",
        &format!("{}stock", sys.prefix),
        "--json",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Runs `outbox-audit --json` against `sys` on `brokers` with `extra` flags.
pub async fn run(sys: &System, brokers: &str, extra: &[&str]) -> AuditRun {
    let args = audit_args(sys, brokers, extra);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(workspace_binary("outbox-audit"))
            .args(&args)
            .env_remove("OUTBOX_TOPIC_PREFIX")
            .stdin(Stdio::null())
            .output()
            .expect("run outbox-audit")
    })
    .await
    .unwrap();
    AuditRun {
        code: out.status.code().unwrap_or(-1),
        report: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the audit until every consumer's committed offsets reached the end of its topics (the
/// consumers commit stored offsets every few seconds) and the system was at rest ([`at_rest`]),
/// so every message is checked against business tables that no longer move; fails the test
/// after `timeout`.
pub async fn run_caught_up(sys: &System, extra: &[&str], timeout: Duration) -> AuditRun {
    let caught_up = |r: &AuditRun| {
        assert!(r.code == 0 || r.code == 1, "audit failed: {}", r.stderr);
        r.messages_ahead() == 0
    };
    run_until_at_rest(sys, &sys.brokers, extra, timeout, caught_up)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "timed out after {timeout:?} waiting for the consumers' committed offsets to \
                 reach the end of their topics"
            )
        })
}

/// Runs the audit until a run is a verdict on a system at rest by `caught_up` ([`at_rest`]).
///
/// # Errors
/// The last run, when `timeout` passed first.
pub async fn run_until_at_rest(
    sys: &System,
    brokers: &str,
    extra: &[&str],
    timeout: Duration,
    caught_up: impl Fn(&AuditRun) -> bool,
) -> Result<AuditRun, AuditRun> {
    // The previous run, to judge the next one by; the last one when the time is up.
    let previous: std::sync::Mutex<Option<AuditRun>> = std::sync::Mutex::new(None);
    let previous = &previous;
    let caught_up = &caught_up;
    let at_rest_run = outbox_process::poll::poll_every(Duration::from_millis(250), timeout, || async move {
        let r = run(sys, brokers, extra).await;
        let mut previous = previous.lock().unwrap();
        if at_rest(previous.as_ref(), &r, caught_up) {
            return Some(r);
        }
        eprintln!(
            "audit: not at rest yet ({} messages ahead of the consumers, {} unpublished, {} on the broker)",
            r.messages_ahead(),
            r.unpublished(),
            r.count("broker.messages")
        );
        *previous = Some(r);
        None
    })
    .await;
    at_rest_run.ok_or_else(|| {
        previous
            .lock()
            .unwrap()
            .take()
            .expect("poll_every runs the audit at least once")
    })
}

/// Whether `current` is a verdict on a system at rest: the run before it (`previous`) and it
/// both found the system `caught_up`, and no message reached the broker in between.
///
/// One caught-up run is not enough. The audit reads the business tables first and the
/// committed offsets last, so a run can find every consumer caught up although its business
/// snapshot was taken while the last events were still being applied (`--settle-s 0` leaves
/// nothing out): a chaos run reported two paid orders with stock reserved and no outbound,
/// whose `StockReserved` the WMS applied a moment after the audit read the outbounds and
/// committed before it read the offsets. After a caught-up run every message then on the
/// broker was applied; when none arrived since, nothing was in flight while the next run read
/// the business tables.
pub fn at_rest(
    previous: Option<&AuditRun>,
    current: &AuditRun,
    caught_up: impl Fn(&AuditRun) -> bool,
) -> bool {
    previous.is_some_and(|p| {
        caught_up(p) && p.count("broker.messages") == current.count("broker.messages")
    }) && caught_up(current)
}

/// The three consumers and databases, as the report names them.
const PARTS: [&str; 3] = ["order", "wms", "stock"];

impl AuditRun {
    /// Messages on the broker past a consumer group's committed offsets, all consumers.
    pub fn messages_ahead(&self) -> i64 {
        PARTS
            .iter()
            .map(|c| self.count(&format!("consumer.{c}.messages_ahead")))
            .sum()
    }

    /// Outbox rows not yet published, all databases.
    pub fn unpublished(&self) -> i64 {
        PARTS
            .iter()
            .map(|c| self.count(&format!("outbox.{c}.unpublished")))
            .sum()
    }
}

/// Creates `topics` with the independent client (kafka-python).
pub fn create_topics(brokers: &str, partitions: i32, topics: &[&str]) {
    create_topics_with(brokers, partitions, &[], topics);
}

/// [`create_topics`] with topic-level `configs` (`name=value`, e.g. `max.message.bytes=2048`).
pub fn create_topics_with(brokers: &str, partitions: i32, configs: &[&str], topics: &[&str]) {
    let partitions = partitions.to_string();
    let mut argv = vec![
        "create-topics",
        "--brokers",
        brokers,
        "--partitions",
        &partitions,
    ];
    for c in configs {
        argv.extend_from_slice(&["--config", c]);
    }
    argv.extend_from_slice(topics);
    crate::verify::run_python(&crate::verify::kafka_tool(), argv);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(ahead: i64, unpublished: i64, messages: i64) -> AuditRun {
        AuditRun {
            code: 0,
            report: serde_json::json!({"counts": {
                "consumer.wms.messages_ahead": ahead,
                "outbox.stock.unpublished": unpublished,
                "broker.messages": messages,
            }}),
            stderr: String::new(),
        }
    }

    #[test]
    fn a_verdict_needs_a_caught_up_run_before_it_and_no_message_since() {
        let caught_up = |r: &AuditRun| r.messages_ahead() == 0 && r.unpublished() == 0;
        let settled = report(0, 0, 100);
        assert!(
            !at_rest(None, &settled, caught_up),
            "the first caught-up run read the business tables before it knew"
        );
        assert!(
            !at_rest(Some(&report(2, 0, 98)), &settled, caught_up),
            "the run before still had messages to apply: this run's business read may predate them"
        );
        assert!(!at_rest(Some(&report(0, 1, 100)), &settled, caught_up));
        assert!(
            !at_rest(Some(&report(0, 0, 99)), &settled, caught_up),
            "a message arrived since the run before"
        );
        assert!(!at_rest(Some(&settled), &report(1, 0, 100), caught_up));
        assert!(at_rest(Some(&settled), &report(0, 0, 100), caught_up));
    }
}
