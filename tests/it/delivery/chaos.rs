//! Guarantees 1 and 4 under chaos, the CI-sized run: the whole system under load (orders with
//! duplicate requests and callbacks, refunds before and after shipping, marketplace pushes)
//! through a fault schedule of every kind (relays, consumers and the order service SIGKILLed,
//! a relay paused until the others took its buckets over (every database's outbox is split
//! into buckets shared by two or three active relays), the broker and PostgreSQL restarted,
//! their proxies stalled and cut), then drained and audited: the audit must be clean, no event
//! may be on the broker twice for a `read_committed` reader, and every fault must recover.
//! `make chaos` runs the same binary with longer settings.
//! The broker faults hit Apache Kafka itself: its JVM SIGKILLed and started again on the same
//! storage, and its proxy stalled and cut. Everything runs on the secured stack: every process
//! (services, relays, the audit) logs in to Kafka with SASL_SSL + SCRAM-SHA-512 and to
//! PostgreSQL with `verify-full` as its least-privilege role, passwords from files; the
//! database sessions at the end of the load show each role's, all over TLS.

use e2e::proc::workspace_binary;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_under_load_ends_with_a_clean_audit() {
    let _heavy = e2e::cpu_heavy().await;
    let json = e2e::proc::log_dir().join(format!("chaos-{:08x}.json", rand::random::<u32>()));
    let args = [
        "--rate",
        "8",
        "--duration-s",
        "150",
        "--faults",
        "10",
        "--seed",
        "11",
        "--json",
    ];
    let json_arg = json.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(workspace_binary("chaos"))
            .args(args)
            .arg(&json_arg)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run the chaos binary")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
        .unwrap_or_else(|e| {
            panic!(
                "no summary ({e}); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let _ = std::fs::remove_file(&json);
    assert_eq!(
        summary["security"],
        e2e::chaos::world::SECURITY,
        "the run says how it was secured"
    );
    let sessions = summary["db_sessions"].as_array().unwrap();
    for role in [
        "outbox_relay",
        "order_service",
        "wms_service",
        "stock_service",
    ] {
        assert!(
            sessions
                .iter()
                .any(|s| s["role"] == role && s["sessions"].as_i64() > Some(0)),
            "{role} holds database sessions: {sessions:?}"
        );
    }
    assert!(
        sessions.iter().all(|s| s["tls"] == s["sessions"]),
        "every database session is over TLS: {sessions:?}"
    );
    let faults = summary["faults"].as_array().unwrap();
    let kinds = summary["faults_by_kind"].as_object().unwrap();
    assert_eq!(kinds.len(), 10, "every kind: {kinds:?}");
    for (kind, n) in kinds {
        assert!(n.as_u64() >= Some(1), "{kind} was injected: {kinds:?}");
    }
    let by_kind: u64 = kinds.values().filter_map(Value::as_u64).sum();
    assert_eq!(
        faults.len() as u64,
        by_kind,
        "every injected fault is in the list: {kinds:?}"
    );
    for f in faults {
        assert!(
            f["recovered_after_ms"].is_u64(),
            "every fault recovers: {f}"
        );
        assert!(f["unhealed"].is_null(), "every fault is healed: {f}");
    }
    assert_eq!(summary["drained"], true, "every outbox drained");
    assert_eq!(
        summary["audit_code"], 0,
        "the audit is clean: {} {}",
        summary["audit"], summary["audit_error"]
    );
    assert_eq!(
        summary["audit"]["violations"].as_array().map(Vec::len),
        Some(0)
    );
    // Several relays per database, each SIGKILLed, SIGSTOPped and cut by the faults, publishing
    // in Kafka transactions and settling a taken bucket from its records: a `read_committed`
    // reader finds no event twice.
    assert_eq!(
        summary["audit"]["counts"]["broker.duplicate_messages"].as_i64(),
        Some(0),
        "no event twice on the broker for a read_committed reader: {}",
        summary["audit"]["counts"]
    );
    // The audit checked a real load, not a handful of orders. A floor, not a rate: on 2 cores
    // with the secured stack and two other tests beside it, 956 of 1 200 offered orders were
    // paid in one run and 425 in a run beside a second whole test suite.
    let paid = summary["audit"]["counts"]["orders_paid"].as_i64().unwrap();
    assert!(paid > 300, "only {paid} orders were paid");
    assert!(summary["load"]["completed"].as_u64().unwrap() > 0);
    assert!(out.status.success(), "the run passes:\n{stdout}");
}
