//! `relay-bench` against the suite's PostgreSQL and broker: every phase at smoke sizes, so the
//! benchmark the book's figures (docs/src/benchmarks.md) come from keeps running. No figure is asserted against a
//! threshold (a busy machine must not fail this test): only that each phase ran, counted every
//! event it wrote as published, and reported what it measured, and that the events of the two
//! drains are on the broker, each once, and the isolation runs' healthy events, none of a
//! poisoned aggregate and every suspect aggregate's in order (kafka-python).

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

const EVENTS: u64 = 2_000;
const BACKLOG: u64 = 5_000;
const POISONED: u64 = 50;
const SUSPECTS: u64 = 20;

/// Runs `relay-bench` with every phase (the opt-in ones included) at smoke sizes; its JSON
/// report. Killed, and the test failed, if it takes longer than `deadline`.
fn run_bench(dir: &Path, deadline: Duration) -> Value {
    let out = dir.join("relay-bench.json");
    let mut child = Command::new(e2e::proc::workspace_binary("relay-bench"))
        .args(["--relay-bin"])
        .arg(e2e::proc::relay_binary())
        .arg("--out")
        .arg(&out)
        .args([
            "--phases",
            "produce,db,drain,naive,latency,isolation,insert,failures,backlog,parked,sizes,topics,tail,debezium",
            "--events",
            &EVENTS.to_string(),
            "--naive-events",
            "100",
            "--load-rate",
            "200",
            "--load-seconds",
            "2",
            "--idle-seconds",
            "1",
            "--isolation-events",
            &EVENTS.to_string(),
            "--poisoned-aggregates",
            &POISONED.to_string(),
            "--suspect-aggregates",
            &SUSPECTS.to_string(),
            "--insert-seconds",
            "1",
            "--failure-outbox-rows",
            &EVENTS.to_string(),
            "--failure-rows",
            "100,1000",
            "--claim-repeats",
            "1",
            "--backlog-events",
            &BACKLOG.to_string(),
            "--backlog-probe-secs",
            "1",
            "--parked-behind",
            "2000",
            "--parked-samples",
            "5",
            "--size-payloads",
            "100,16384",
            "--size-budget-mb",
            "1",
            "--topic-counts",
            "1,10",
            "--topic-events",
            "1000",
        ])
        .env("KAFKA_BROKERS", e2e::kafka_brokers())
        .stdout(std::fs::File::create(dir.join("stdout.txt")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr.txt")).unwrap())
        .spawn()
        .expect("start relay-bench");
    let Some(status) = e2e::proc::wait_exit(&mut child, deadline) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "relay-bench still running after {deadline:?}; its log: {}",
            dir.join("stderr.txt").display()
        );
    };
    let stderr = std::fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
    assert!(status.success(), "relay-bench exited {status}:\n{stderr}");
    let table = std::fs::read_to_string(dir.join("stdout.txt")).unwrap();
    eprintln!("{table}");
    serde_json::from_slice(&std::fs::read(&out).expect("the JSON report")).unwrap()
}

fn num(v: &Value, path: &str) -> f64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in the report: {v}"))
}

/// A rate or a latency that was measured: finite and above zero.
fn measured(v: &Value, path: &str) -> f64 {
    let x = num(v, path);
    assert!(x.is_finite() && x > 0.0, "{path} = {x}");
    x
}

/// A CPU figure that was reported (finite, not negative: CPU time is counted in 10 ms ticks,
/// so a short run of an efficient process may show none).
fn reported(v: &Value, path: &str) {
    let x = num(v, path);
    assert!(x.is_finite() && x >= 0.0, "{path} = {x}");
}

/// A relay run of the report (`drain`, `backlog.drain`): it published `events` and reported
/// its rate, CPU per event and lease epochs. (Leadership is not asserted: the backlog phase
/// runs a 3 s lease, which a stall of the busy CI machine may cost.)
fn check_relay_run(run: &Value, name: &str, events: u64) {
    assert_eq!(num(run, "events"), events as f64, "{name}: {run}");
    measured(run, "events_per_s");
    reported(run, "cpu.relay_us_per_event");
    assert!(
        run["lease_epochs"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{name}: {run}"
    );
}

/// Messages on `topic` and distinct event ids among them, read by kafka-python.
fn distinct_event_ids(topic: String) -> (usize, usize) {
    let records = e2e::verify::dump(&e2e::kafka_brokers(), &[topic]);
    let ids: HashSet<_> = records
        .iter()
        .map(|r| r.headers.get("event_id").cloned().expect("event_id header"))
        .collect();
    (records.len(), ids.len())
}

/// Keys of the isolation phase's front aggregates: poisoned `p-<k>`, suspects `s-<k>` (the
/// healthy workload's aggregate ids are neither).
fn is_front(key: &str) -> bool {
    key.starts_with("p-") || key.starts_with("s-")
}

/// Per front aggregate, the payloads' `n` of its events in the order the broker holds them
/// (partition, offset), each event once.
fn front_sequences(
    records: &[e2e::verify::Record],
) -> std::collections::BTreeMap<String, Vec<i64>> {
    let mut sorted: Vec<&e2e::verify::Record> = records
        .iter()
        .filter(|r| r.key.as_deref().is_some_and(is_front))
        .collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut seen = HashSet::new();
    let mut out: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for r in sorted {
        if !seen.insert(r.headers.get("event_id").expect("event_id header")) {
            continue;
        }
        let value: Value = serde_json::from_str(r.value.as_deref().unwrap_or("null")).unwrap();
        out.entry(r.key.clone().unwrap())
            .or_default()
            .push(value["n"].as_i64().expect("a front event's payload has n"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_bench_runs_every_phase_on_the_real_servers_and_each_drained_event_lands_once() {
    // Many processes at once: not beside the other CPU-sensitive tests.
    let _heavy = e2e::cpu_heavy().await;
    let dir = std::env::temp_dir().join(format!("outbox-bench-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.clone();
    let report = tokio::task::spawn_blocking(move || run_bench(&path, Duration::from_secs(600)))
        .await
        .unwrap();
    assert_eq!(report["errors"], serde_json::json!([]), "phase errors");

    // Raw limits, and the relay draining the same backlog.
    assert_eq!(num(&report, "raw_produce.messages"), EVENTS as f64);
    measured(&report, "raw_produce.msgs_per_s");
    assert_eq!(num(&report, "raw_db.rows"), EVENTS as f64);
    measured(&report, "raw_db.rows_per_s");
    let drain = &report["relay_drain"];
    check_relay_run(drain, "drain", EVENTS);
    assert_eq!(num(&report, "naive.events"), 100.0);
    measured(&report, "ratios.relay_over_raw_produce");

    // Latency at a fixed load: every committed event seen by the consumer and acked.
    let latency = &report["latency"];
    let committed = num(latency, "committed");
    assert!(committed >= 200.0, "latency phase committed {committed}");
    assert_eq!(num(latency, "not_seen"), 0.0, "{latency}");
    assert_eq!(num(latency, "commit_to_ack_ms.count"), committed);
    assert_eq!(num(latency, "commit_to_seen_ms.count"), committed);
    for q in ["commit_to_ack_ms.p99", "commit_to_seen_ms.p99"] {
        measured(latency, q);
    }
    reported(latency, "idle.relay_cpu_ms_per_s");
    // Where the relay's part went: every step of its batches was timed (a batch may straddle
    // the window's edges, so the counts are not compared).
    for stage in ["claim", "publish", "mark"] {
        assert!(
            num(latency, &format!("stages.{stage}.count")) >= 1.0,
            "{stage}: {latency}"
        );
        measured(latency, &format!("stages.{stage}.p99"));
    }

    // The tail: one run on a fresh table, one after the relay drained `--events` from it, each
    // seen whole by the consumer.
    let tail = &report["tail"];
    assert_eq!(num(tail, "drained_events"), EVENTS as f64, "{tail}");
    for side in ["fresh", "drained"] {
        let runs = tail[side]
            .as_array()
            .unwrap_or_else(|| panic!("tail.{side}: {tail}"));
        assert_eq!(runs.len(), 1, "tail.{side}: {tail}");
        assert_eq!(num(&runs[0], "not_seen"), 0.0, "tail.{side}: {tail}");
        measured(&runs[0], "seen_p99_ms");
    }
    measured(tail, "drained_over_fresh_p99");

    // Isolation: the poisoned rows (three per aggregate) stay behind, the rest drains. On the
    // broker (kafka-python): every healthy event; no event of a poisoned aggregate (the two
    // behind each unsendable first event wait for it); each suspect aggregate's three events,
    // in order.
    let isolation = &report["isolation"];
    let runs = isolation["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "A B C C B A");
    for run in runs {
        measured(run, "events_per_s");
        if run["variant"] == "poisoned" {
            assert_eq!(num(run, "front_rows_left"), (3 * POISONED) as f64, "{run}");
        }
        let topic = format!("{}order", run["topic_prefix"].as_str().unwrap());
        let records =
            tokio::task::spawn_blocking(move || e2e::verify::dump(&e2e::kafka_brokers(), &[topic]))
                .await
                .unwrap();
        let front = front_sequences(&records);
        let healthy: HashSet<&String> = records
            .iter()
            .filter(|r| !r.key.as_deref().is_some_and(is_front))
            .map(|r| r.headers.get("event_id").expect("event_id header"))
            .collect();
        assert_eq!(
            healthy.len(),
            EVENTS as usize,
            "healthy events on the broker: {run}"
        );
        if run["variant"] == "suspects" {
            assert_eq!(
                front.len(),
                SUSPECTS as usize,
                "suspect aggregates out: {front:?}"
            );
            for (aggregate, ns) in &front {
                assert_eq!(ns.len(), 3, "{aggregate}: {ns:?}");
                assert!(
                    ns.windows(2).all(|w| w[0] < w[1]),
                    "{aggregate} in order: {ns:?}"
                );
            }
        } else {
            // A poisoned aggregate's first event cannot be sent (undecodable, or a topic no
            // broker takes); the two behind it would land here if they got out.
            assert!(
                front.is_empty(),
                "nothing of a poisoned aggregate got out: {front:?}"
            );
        }
    }

    // Inserts with and without the per-aggregate lock; claims beside a failure table.
    assert_eq!(report["insert"]["runs"].as_array().unwrap().len(), 6);
    measured(&report, "insert.locked.inserts_per_s");
    measured(&report, "insert.unlocked.inserts_per_s");
    measured(&report, "insert.first_trigger.inserts_per_s");
    let sizes = report["failures"]["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 2);
    for size in sizes {
        for claim in size["claims"].as_array().unwrap() {
            assert!(!claim["ms"].as_array().unwrap().is_empty(), "{claim}");
        }
    }

    // A parked aggregate's backlog beside healthy events: both sides timed.
    let parked = &report["parked"];
    assert_eq!(num(parked, "behind"), 2_000.0);
    for side in ["without_ms", "with_ms"] {
        assert_eq!(num(parked, &format!("{side}.count")), 5.0, "{parked}");
        measured(parked, &format!("{side}.p50"));
    }
    measured(parked, "p50_ratio");
    measured(parked, "first_after_backlog_ms");

    // Debezium and the relay on the same Debezium table: both drained the backlog and saw
    // every event of their load, each figure measured.
    let debezium = &report["debezium"];
    for side in ["debezium", "relay"] {
        let s = &debezium[side];
        measured(s, "drain_events_per_s");
        measured(s, "drain_total_us_per_event");
        measured(s, "commit_to_seen_ms.p99");
        assert_eq!(num(s, "not_seen"), 0.0, "{side}: {s}");
        measured(s, "peak_rss_kb");
    }

    // The backlog, and the growth phases (payload sizes, topic counts) against raw produce.
    check_relay_run(&report["backlog"]["drain"], "backlog", BACKLOG);
    for (phase, points) in [("sizes", 2), ("topics", 2)] {
        let points_of = report[phase]["points"].as_array().unwrap();
        assert_eq!(points_of.len(), points, "{phase}");
        for point in points_of {
            assert_eq!(point["errors"], serde_json::json!([]), "{phase}: {point}");
            measured(point, "raw.msgs_per_s");
            measured(point, "relay.events_per_s");
            measured(point, "relay_over_raw");
        }
    }

    // What the drains claim to have moved is on the broker, once per event (kafka-python):
    // every event, and no duplicate unless the lease changed hands (a new holder sends again
    // what the old one had sent but not marked).
    for (run, events) in [(drain, EVENTS), (&report["backlog"]["drain"], BACKLOG)] {
        let topic = format!("{}order", run["topic_prefix"].as_str().unwrap());
        let (messages, ids) = tokio::task::spawn_blocking(move || distinct_event_ids(topic))
            .await
            .unwrap();
        assert_eq!(ids, events as usize, "distinct events on the broker");
        if run["lease_epochs"] == serde_json::json!([1]) {
            assert_eq!(messages, events as usize, "messages under one lease epoch");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
