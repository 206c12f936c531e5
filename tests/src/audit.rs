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
        outbox_kit::schema::migrate_ledger(&db.pool)
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
/// consumers commit stored offsets every few seconds), so every message is checked; fails the
/// test after `timeout`.
pub async fn run_caught_up(sys: &System, extra: &[&str], timeout: Duration) -> AuditRun {
    crate::wait_for(
        "the consumers' committed offsets to reach the end of their topics",
        timeout,
        || async {
            let r = run(sys, &sys.brokers, extra).await;
            assert!(r.code == 0 || r.code == 1, "audit failed: {}", r.stderr);
            let ahead: i64 = ["order", "wms", "stock"]
                .iter()
                .map(|c| r.count(&format!("consumer.{c}.messages_ahead")))
                .sum();
            (ahead == 0).then_some(r)
        },
    )
    .await
}

/// Creates `topics` with the independent client (kafka-python).
pub fn create_topics(brokers: &str, partitions: i32, topics: &[&str]) {
    let partitions = partitions.to_string();
    let mut argv = vec![
        "create-topics",
        "--brokers",
        brokers,
        "--partitions",
        &partitions,
    ];
    argv.extend_from_slice(topics);
    crate::verify::run_python(&crate::verify::kafka_tool(), argv);
}
