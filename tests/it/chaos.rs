//! The CI-sized chaos run: the whole system under load (orders with duplicate requests and
//! callbacks, refunds before and after shipping, marketplace pushes) through a fault schedule of
//! every kind (relays, consumers and the order service SIGKILLed, the leading relay paused
//! until the standby took over, the broker and PostgreSQL restarted, their proxies stalled and
//! cut), then drained and audited: the audit must be clean and every fault must recover.
//! `make chaos` runs the same binary with longer settings.
//! The broker faults hit Apache Kafka itself: its JVM SIGKILLed and started again on the same
//! storage, and its proxy stalled and cut.

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
        "the audit is clean: {}",
        summary["audit"]
    );
    assert_eq!(
        summary["audit"]["violations"].as_array().map(Vec::len),
        Some(0)
    );
    assert!(summary["audit"]["counts"]["orders_paid"].as_i64().unwrap() > 500);
    assert!(summary["load"]["completed"].as_u64().unwrap() > 0);
    assert!(out.status.success(), "the run passes:\n{stdout}");
}
