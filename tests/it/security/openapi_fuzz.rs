//! The independent fuzzer: `schemathesis` (the project venv's `st`, pinned by
//! `deploy/local/install-deps.sh`) with `--checks all` against each service's generated
//! `/openapi.json`, each service a real process on a fresh database.
//!
//! Per service, three runs with a fixed, printed seed (`SCHEMATHESIS_SEED` overrides it):
//! 1. without credentials, every mode and phase: each protected operation must answer its
//!    documented 401, and the database fingerprint (every table's rows) must be unchanged;
//! 2. with an operator's bearer token, `--mode negative`: only requests that break the
//!    document (wrong types, out-of-range numbers, over-long or patterned strings, NUL bytes,
//!    extra properties, missing required headers). Every one must be refused with a 4xx
//!    (`negative_data_rejection`), and the fingerprint must still be the same: rejected
//!    requests change nothing;
//! 3. with the token, `--mode all`, every phase (examples, coverage, fuzzing, stateful): valid
//!    requests must be accepted, answers must match the document (status, headers, content
//!    type, body schema), nothing may answer 5xx; `ignored_auth` checks that dropping the
//!    token is refused.
//!
//! Both must report zero failures. The settings the schema cannot express (a rejection of
//! valid data that depends on stored data) are in `tests/schemathesis/schemathesis.toml`,
//! each with its reason. Callbacks and marketplace pushes are HMAC-signed, which the fuzzer
//! cannot do: they answer 401, as documented; their bodies are fuzzed, correctly signed, by
//! the property test in `tests/it/security/http_fuzz.rs` instead.

use std::process::Command;
use std::time::Duration;

use e2e::db::{fingerprint_all, fresh_database, TestDb};
use e2e::fulfilment::{consumer_env, Service};
use e2e::observe::venv_tool;

/// Test cases per operation and phase: enough for every constraint of every operation to be
/// tried, small enough for the three services to take about a minute together.
const MAX_EXAMPLES: &str = "40";

fn seed() -> u64 {
    std::env::var("SCHEMATHESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201)
}

/// What one `st run` reported.
#[derive(Debug)]
struct StRun {
    generated: u64,
    passed: bool,
    output: String,
}

/// Runs schemathesis against `base`'s `/openapi.json`.
fn st_run(name: &str, base: &str, mode: &str, phases: &str, extra: &[&str]) -> StRun {
    let config = e2e::workspace_root().join("tests/schemathesis/schemathesis.toml");
    let seed = seed().to_string();
    let schema = format!("{base}/openapi.json");
    let mut args = vec![
        "--no-color",
        "--config-file",
        config.to_str().unwrap(),
        "run",
        &schema,
        "--checks",
        "all",
        "--mode",
        mode,
        "--phases",
        phases,
        "--seed",
        &seed,
        "--max-examples",
        MAX_EXAMPLES,
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--request-timeout",
        "30",
    ];
    args.extend_from_slice(extra);
    eprintln!("{name}: st {}", args.join(" "));
    let out = Command::new(venv_tool("st"))
        .args(&args)
        .current_dir(e2e::proc::log_dir())
        .output()
        .expect("run schemathesis");
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // "  1340 generated, 1340 passed" / "  951 generated, 5 found 5 unique failures" (a
    // warning may say "generated" too: "mostly rejected generated data")
    let generated = output
        .lines()
        .find_map(|l| {
            let (n, _) = l.trim().split_once(" generated,")?;
            n.parse().ok()
        })
        .unwrap_or(0);
    let summary = output
        .lines()
        .rev()
        .find(|l| l.contains(" in ") && l.contains("=="))
        .unwrap_or("")
        .trim_matches(|c| c == '=' || c == ' ')
        .to_owned();
    eprintln!(
        "{name} ({mode}, seed {seed}): {generated} test cases generated; {summary}; exit {}",
        out.status
    );
    StRun {
        generated,
        passed: out.status.success(),
        output,
    }
}

const ALL_PHASES: &str = "examples,coverage,fuzzing,stateful";

/// The three runs against one service on `db`; panics with schemathesis's report on any
/// failure.
async fn fuzz(name: &str, service: &Service, db: &TestDb) {
    service.wait_ready(Duration::from_secs(90)).await;
    let base = service.url("");
    let auth = format!("Authorization: Bearer {}", e2e::auth::operator());
    let before = fingerprint_all(&db.pool).await;
    // Without credentials: every protected operation must answer its documented 401, and
    // nothing at all may change.
    let anonymous = st_run(
        &format!("{name} without a token"),
        &base,
        "all",
        ALL_PHASES,
        &[],
    );
    assert!(
        anonymous.passed,
        "{name}: schemathesis found failures without credentials:\n{}",
        anonymous.output
    );
    assert_eq!(
        before,
        fingerprint_all(&db.pool).await,
        "{name}: requests without credentials changed the database"
    );
    let negative = st_run(name, &base, "negative", "coverage,fuzzing", &["-H", &auth]);
    assert!(
        negative.passed,
        "{name}: schemathesis found failures with invalid requests:\n{}",
        negative.output
    );
    assert!(
        negative.generated > 0,
        "{name}: nothing generated\n{}",
        negative.output
    );
    assert_eq!(
        before,
        fingerprint_all(&db.pool).await,
        "{name}: rejected requests changed the database"
    );
    let all = st_run(name, &base, "all", ALL_PHASES, &["-H", &auth]);
    assert!(
        all.passed,
        "{name}: schemathesis found failures:\n{}",
        all.output
    );
    assert!(all.generated > negative.generated, "{name}: {}", all.output);
    assert!(
        !service.log_text().contains("Request failed"),
        "{name} logged a server fault; log {}",
        service.log.display()
    );
}

fn spawn(name: &str, db: &TestDb, extra: &[(&str, &str)]) -> Service {
    let prefix = e2e::unique_topic_prefix();
    let mut env = consumer_env(db, &e2e::kafka_brokers(), &prefix, name);
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    Service::spawn(name, name, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_failure_and_rejected_requests_change_nothing() {
    eprintln!(
        "schemathesis seed {} (set SCHEMATHESIS_SEED to change)",
        seed()
    );
    let (stock_db, wms_db, order_db) =
        tokio::join!(fresh_database(), fresh_database(), fresh_database());
    let stock = spawn("stock-consumer", &stock_db, &[]);
    let wms = spawn("wms-consumer", &wms_db, &[]);
    let order = spawn(
        "order-service",
        &order_db,
        &[
            ("PAYMENT_CALLBACK_SECRET", "fuzz-callback-secret"),
            ("MARKETPLACE_SECRET", "fuzz-marketplace-secret"),
        ],
    );
    fuzz("stock-consumer", &stock, &stock_db).await;
    fuzz("wms-consumer", &wms, &wms_db).await;
    // A catalog entry the document's example order uses, so the stateful phase can follow
    // the links from a created order to reading, cancelling, refunding it.
    order.wait_ready(Duration::from_secs(90)).await;
    let r = reqwest::Client::new()
        .put(order.url("/skus/S1"))
        .headers(e2e::fulfilment::operator_headers())
        .json(&serde_json::json!({"name": "Mug", "price_cents": 1299}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    fuzz("order-service", &order, &order_db).await;
}
