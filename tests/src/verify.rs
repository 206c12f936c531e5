//! Checking what landed on the broker with an independent client (kafka-python, through
//! `tests/tools/kafka_tool.py`), against what the writers committed.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;
use uuid::Uuid;

use crate::stream::Written;

/// One message as kafka-python read it.
#[derive(Debug, Clone, Deserialize)]
pub struct Record {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key as UTF-8.
    pub key: Option<String>,
    /// Headers.
    pub headers: HashMap<String, String>,
    /// Value as UTF-8.
    pub value: Option<String>,
    /// Key bytes in hex ([`dump_bytes`] only).
    #[serde(default)]
    pub key_hex: Option<String>,
    /// Value bytes in hex, `None` for a tombstone ([`dump_bytes`] only).
    #[serde(default)]
    pub value_hex: Option<String>,
    /// Headers in order, each value's bytes in hex, `None` for a header without a value
    /// ([`dump_bytes`] only).
    #[serde(default)]
    pub header_list: Vec<(String, Option<String>)>,
    /// The message as the cloudevents SDK reads it ([`dump_cloudevents`] only).
    #[serde(default)]
    pub cloudevent: Option<serde_json::Value>,
}

/// The `event_type` header of `r` (empty when it has none).
pub fn event_type(r: &Record) -> &str {
    r.headers.get("event_type").map_or("", String::as_str)
}

/// The kafka-python venv's interpreter: `PYTHON`, else deploy/local's cache.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("PYTHON") {
        return p.into();
    }
    let cache = std::env::var("OUTBOX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/outbox-relay")
        });
    let venv = cache.join("venv/bin/python");
    assert!(
        venv.exists(),
        "{} missing: run deploy/local/install-deps.sh or set PYTHON",
        venv.display()
    );
    venv
}

/// Runs `script` (a path) with the venv's interpreter and `args`; its output, once it exited 0.
///
/// # Panics
/// When it cannot be started or exits otherwise (with the script's name and its stderr).
pub fn run_python<I, S>(script: &std::path::Path, args: I) -> std::process::Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    run_python_with_env(script, args, &[])
}

/// [`run_python`] with extra environment variables (e.g. kafka_tool.py's `KAFKA_SECURITY_*`).
///
/// # Panics
/// See [`run_python`].
pub fn run_python_with_env<I, S>(
    script: &std::path::Path,
    args: I,
    envs: &[(&str, &str)],
) -> std::process::Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = try_python_with_env(script, args, envs);
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `script` with the venv's interpreter, `args`, extra environment `envs` and no input;
/// its output, whatever its exit status (a refusal may be what a test expects).
///
/// # Panics
/// When it cannot be started.
pub fn try_python_with_env<I, S>(
    script: &std::path::Path,
    args: I,
    envs: &[(&str, &str)],
) -> std::process::Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(python())
        .arg(script)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()))
}

/// The independent Kafka client's command-line tool (`tests/tools/kafka_tool.py`).
pub fn kafka_tool() -> PathBuf {
    crate::workspace_root().join("tests/tools/kafka_tool.py")
}

/// Reads every message currently on `topics` from the beginning.
pub fn dump(brokers: &str, topics: &[String]) -> Vec<Record> {
    dump_with(brokers, topics, &["--timeout", "300"])
}

/// [`dump`] as a `read_committed` reader sees it: no record of an aborted (or still open)
/// Kafka transaction.
pub fn dump_committed(brokers: &str, topics: &[String]) -> Vec<Record> {
    dump_with(
        brokers,
        topics,
        &["--timeout", "300", "--isolation-level", "read_committed"],
    )
}

/// Reads the first `n` messages of `topics` (fewer if they are not there within 30 s).
pub fn dump_first(brokers: &str, topics: &[String], n: usize) -> Vec<Record> {
    dump_with(
        brokers,
        topics,
        &["--expect", &n.to_string(), "--timeout", "30"],
    )
}

/// [`dump_first`] with the exact key and value bytes ([`Record::key_hex`], [`Record::value_hex`]).
pub fn dump_bytes(brokers: &str, topics: &[String], n: usize) -> Vec<Record> {
    dump_with(
        brokers,
        topics,
        &["--expect", &n.to_string(), "--timeout", "60", "--bytes"],
    )
}

/// [`dump_bytes`], each message also read as a binary-mode CloudEvent by the cloudevents
/// Python SDK ([`Record::cloudevent`]).
pub fn dump_cloudevents(brokers: &str, topics: &[String], n: usize) -> Vec<Record> {
    dump_with(
        brokers,
        topics,
        &[
            "--expect",
            &n.to_string(),
            "--timeout",
            "60",
            "--bytes",
            "--cloudevents",
        ],
    )
}

/// [`dump`] through a secured connection: `envs` are kafka_tool.py's security variables (the
/// binaries' names: `KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_*`, `KAFKA_SSL_*`).
pub fn dump_secured(brokers: &str, topics: &[String], envs: &[(&str, &str)]) -> Vec<Record> {
    dump_with_env(brokers, topics, &["--timeout", "300"], envs)
}

/// Reads `topics` with the dump tool's extra `args` (`--timeout`, `--isolation-level`, ...).
pub fn dump_with(brokers: &str, topics: &[String], args: &[&str]) -> Vec<Record> {
    dump_with_env(brokers, topics, args, &[])
}

fn dump_with_env(
    brokers: &str,
    topics: &[String],
    args: &[&str],
    envs: &[(&str, &str)],
) -> Vec<Record> {
    let mut argv = vec!["dump", "--brokers", brokers];
    argv.extend_from_slice(args);
    for t in topics {
        argv.extend(["--topic", t.as_str()]);
    }
    let out = run_python_with_env(&kafka_tool(), argv, envs);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l}: {e}")))
        .collect()
}

/// Outcome of comparing the broker with the writers.
#[derive(Debug, Default)]
pub struct Report {
    /// Messages read.
    pub messages: usize,
    /// Distinct committed events found.
    pub delivered: usize,
    /// Extra copies of events (at-least-once duplicates).
    pub duplicates: usize,
    /// Committed events not on the broker.
    pub missing: Vec<Uuid>,
    /// Rolled-back events found on the broker.
    pub rolled_back_found: Vec<Uuid>,
    /// Events on the broker the writers do not know.
    pub unknown_found: usize,
    /// First occurrences of an aggregate's events out of sequence order.
    pub order_violations: Vec<String>,
    /// Messages whose headers do not match the contract.
    pub header_errors: Vec<String>,
    /// Keys seen on more than one partition.
    pub split_keys: usize,
}

impl Report {
    /// True when nothing was lost, nothing rolled back leaked and order held.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty()
            && self.rolled_back_found.is_empty()
            && self.unknown_found == 0
            && self.order_violations.is_empty()
            && self.header_errors.is_empty()
            && self.split_keys == 0
    }
}

/// Compares what the writers committed with the messages on the broker.
pub fn check(written: &Written, records: &[Record], aggregate_type: &str) -> Report {
    let committed: HashMap<Uuid, &crate::stream::WrittenEvent> =
        written.committed.iter().map(|e| (e.event_id, e)).collect();
    let unknown: HashMap<Uuid, &crate::stream::WrittenEvent> =
        written.unknown.iter().map(|e| (e.event_id, e)).collect();
    let rolled: HashSet<Uuid> = written.rolled_back.iter().copied().collect();
    let mut r = Report {
        messages: records.len(),
        ..Default::default()
    };

    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|m| (m.topic.clone(), m.partition, m.offset));
    let mut seen: HashSet<Uuid> = HashSet::new();
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    let mut partitions: HashMap<String, (String, i32)> = HashMap::new();
    for m in sorted {
        let Some(id) = m
            .headers
            .get("event_id")
            .and_then(|s| Uuid::parse_str(s).ok())
        else {
            r.header_errors.push(format!(
                "{}:{}@{} has no event_id header",
                m.topic, m.partition, m.offset
            ));
            continue;
        };
        let ev = match (committed.get(&id), unknown.get(&id)) {
            (Some(e), _) | (None, Some(e)) => *e,
            _ if rolled.contains(&id) => {
                r.rolled_back_found.push(id);
                continue;
            }
            _ => {
                r.unknown_found += 1;
                continue;
            }
        };
        let expect = [
            ("id", id.to_string()),
            ("event_type", "StreamEvent".to_owned()),
            ("aggregate_type", aggregate_type.to_owned()),
            ("aggregate_id", ev.aggregate_id.clone()),
        ];
        for (k, v) in expect {
            if m.headers.get(k) != Some(&v) {
                r.header_errors.push(format!(
                    "{id}: header {k} = {:?}, expected {v}",
                    m.headers.get(k)
                ));
            }
        }
        if !m.headers.contains_key("occurred_at")
            || m.key.as_deref() != Some(ev.aggregate_id.as_str())
        {
            r.header_errors.push(format!(
                "{id}: missing occurred_at or wrong key {:?}",
                m.key
            ));
        }
        let place = (m.topic.clone(), m.partition);
        if let Some(p) = partitions.insert(ev.aggregate_id.clone(), place.clone()) {
            if p != place {
                r.split_keys += 1;
            }
        }
        if !seen.insert(id) {
            r.duplicates += 1;
            continue;
        }
        let last = last_seq.entry(ev.aggregate_id.clone()).or_default();
        if ev.seq <= *last {
            r.order_violations.push(format!(
                "{}: seq {} after {}",
                ev.aggregate_id, ev.seq, last
            ));
        } else {
            *last = ev.seq;
        }
    }
    r.delivered = written
        .committed
        .iter()
        .filter(|e| seen.contains(&e.event_id))
        .count();
    r.missing = written
        .committed
        .iter()
        .filter(|e| !seen.contains(&e.event_id))
        .map(|e| e.event_id)
        .collect();
    r
}
