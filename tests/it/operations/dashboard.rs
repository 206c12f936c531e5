//! The dashboard against real metrics: the whole system (order service, WMS and stock
//! consumers, a relay per database plus a standby for the order database) runs under a small
//! load while a real Prometheus scrapes every process each second; then every query of
//! `deploy/grafana/outbox-relay.json` (the file users import) is evaluated through Prometheus'
//! HTTP API and must return data. A misspelt metric or label name returns nothing and fails.
//!
//! The load is chosen so that every panel has something to show: paid orders through the whole
//! flow, an event the broker refuses (a publish failure), a malformed message (dead letters),
//! a request for an unknown order (an HTTP error), a standby relay (a leader series of 0),
//! and the marketplace channel against its simulator with compensation passes every second (a
//! watermark), while the state gauges are read every second.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::fulfilment::{produce_all, Service, System};
use e2e::observe::{dashboard_queries, Prometheus, ScrapeTarget, DASHBOARD};
use e2e::proc::{RelayArgs, RelayProcess};
use outbox_writer::{enqueue, NewEvent};
use reqwest::StatusCode;
use serde_json::json;

/// The marketplace channel's HMAC key here.
const MARKETPLACE_SECRET: &str = "observe-channel-secret";

/// How long the queries have, after the load, to return data (rates need two scrapes).
const QUERY_DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_dashboard_query_returns_data_from_the_running_system() {
    let queries = dashboard_queries(&e2e::workspace_root().join(DASHBOARD));
    let sim = Service::start_marketplace_simulator(MARKETPLACE_SECRET).await;
    let sys = System::start_with_env(
        &e2e::kafka_brokers(),
        vec![
            ("MARKETPLACE_SECRET".into(), MARKETPLACE_SECRET.into()),
            ("MARKETPLACE_URL".into(), sim.url("")),
            ("MARKETPLACE_COMPENSATION_INTERVAL_MS".into(), "1000".into()),
        ],
        vec![("STATE_METRICS_INTERVAL_MS".into(), "1000".into())],
    )
    .await;
    // A hot standby on the order database's lease: `outbox_relay_leader` 0 next to a 1.
    let standby = RelayProcess::start(&RelayArgs::new(
        &sys.order_db.url,
        &sys.brokers,
        &sys.prefix,
        "relay-order-standby",
    ));

    // Scrape like deploy/prometheus/prometheus.yml: same jobs, same `database` label.
    let mut targets: Vec<ScrapeTarget> = ["order", "wms", "stock"]
        .iter()
        .zip(&sys.relays)
        .map(|(db, r)| ScrapeTarget::new("outbox-relay", &r.metrics_addr, &[("database", db)]))
        .collect();
    targets.push(ScrapeTarget::new(
        "outbox-relay",
        &standby.metrics_addr,
        &[("database", "order")],
    ));
    targets.push(ScrapeTarget::new("order-service", &sys.order.addr(), &[]));
    targets.push(ScrapeTarget::new("wms-consumer", &sys.wms.addr(), &[]));
    targets.push(ScrapeTarget::new("stock-consumer", &sys.stock.addr(), &[]));
    let alerts = e2e::workspace_root().join("deploy/prometheus/alerts.yaml");
    let prom = Prometheus::start(&targets, &[alerts]);
    prom.wait_ready(targets.len(), Duration::from_secs(60))
        .await;
    let rules = prom.api("/api/v1/rules").await.unwrap();
    let loaded: usize = rules["data"]["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .map(|g| g["rules"].as_array().map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0);
    assert!(loaded >= 6, "alert rules not loaded: {rules}");

    // --- load ---------------------------------------------------------------------------
    sys.sku("OBS1", 250).await;
    sys.set_stock("OBS1", 1_000).await;
    // An event librdkafka refuses (over message.max.bytes): publish failures, and a held
    // (later: parked) aggregate, while everything else flows.
    enqueue(
        &sys.order_db.pool,
        &NewEvent::new(
            "order",
            "observe-poison",
            "OrderNoted",
            &json!({"blob": "x".repeat(1_200_000)}),
        ),
    )
    .await
    .unwrap();
    // A message no consumer can read: dead letters.
    produce_all(
        &sys.brokers,
        vec![(
            sys.topic("order"),
            "observe-malformed".into(),
            "not json".into(),
            vec![
                ("event_id".into(), uuid::Uuid::new_v4().to_string()),
                ("event_type".into(), "OrderPaid".into()),
            ],
            None,
        )],
    )
    .await;
    // An HTTP error answer.
    let missing = sys
        .http
        .get(sys.order.url(&format!("/orders/{}", uuid::Uuid::new_v4())))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    // Orders through the whole flow: order → stock → WMS → order.
    let mut last = String::new();
    for i in 0..20 {
        last = sys
            .paid_order(&format!("observer-{i}"), &[("OBS1", 1)])
            .await;
    }
    sys.wait_outbound(&last, "CREATED").await;

    // --- every dashboard query returns data ----------------------------------------------
    let empty: BTreeMap<String, String> = queries
        .iter()
        .map(|(title, e)| (e.clone(), title.clone()))
        .collect();
    let checked = empty.len();
    let empty = std::cell::RefCell::new(empty);
    // Every query once per round (each is an HTTP request to Prometheus): a round every 500 ms.
    outbox_process::poll::poll_every(Duration::from_millis(500), QUERY_DEADLINE, || {
        let (prom, empty) = (&prom, &empty);
        async move {
            let pending: Vec<String> = empty.borrow().keys().cloned().collect();
            for expr in pending {
                match prom.query(&expr).await {
                    Ok(series) if !series.is_empty() => {
                        empty.borrow_mut().remove(&expr);
                    }
                    Ok(_) => {}
                    Err(e) => panic!("dashboard query does not evaluate: {expr}: {e}"),
                }
            }
            empty.borrow().is_empty().then_some(())
        }
    })
    .await;
    let empty = empty.into_inner();
    assert!(
        empty.is_empty(),
        "{} of {checked} dashboard queries returned no data after {QUERY_DEADLINE:?} (a \
         misspelt metric or label, or a metric that is gone); prometheus log {}:\n{}",
        empty.len(),
        prom.log.display(),
        empty
            .iter()
            .map(|(e, t)| format!("  {t}: {e}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("observe: all {checked} dashboard queries returned data");

    // --- every metric the alert rules use exists --------------------------------------------
    // promtool's unit tests feed the rules the series they name, so a misspelt metric there
    // passes them and never fires in production; the running system has the real names.
    let mut selectors: Vec<String> = vec![];
    for group in rules["data"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            selectors.extend(metric_selectors(rule["query"].as_str().unwrap()));
        }
    }
    selectors.sort();
    selectors.dedup();
    let mut missing = vec![];
    for sel in &selectors {
        if prom
            .query(&format!("count({sel})"))
            .await
            .unwrap()
            .is_empty()
        {
            missing.push(sel.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "alert rules use metrics the system does not export: {missing:?}"
    );
    eprintln!(
        "observe: the alert rules' {} metric selectors exist (not-yet-exported ones skipped): {selectors:?}",
        selectors.len()
    );

    // The check itself: a misspelt name returns nothing, so it would have failed above.
    for typo in [
        "outbox_events_publishd_total",
        "sum by (consumer) (rate(consumer_inbox_duplicate_total[5m]))",
    ] {
        assert!(
            prom.query(typo).await.unwrap().is_empty(),
            "{typo} returned data"
        );
    }
}

/// The metric selectors in a PromQL expression of ours: every name starting with `outbox_`,
/// `consumer_`, `order_`, `wms_` or `stock_` (no label of ours does), `up`, and
/// `{__name__=~"..."}` matchers.
fn metric_selectors(expr: &str) -> Vec<String> {
    let mut out = vec![];
    let bytes = expr.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && is_ident(bytes[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let ours = ["outbox_", "consumer_", "order_", "wms_", "stock_"];
            if ours.iter().any(|p| word.starts_with(p)) || word == "up" {
                out.push(word.to_owned());
            }
        } else {
            i += 1;
        }
    }
    let mut rest = expr;
    while let Some(at) = rest.find("__name__=~\"") {
        let tail = &rest[at + "__name__=~\"".len()..];
        let end = tail.find('"').unwrap_or(tail.len());
        out.push(format!("{{__name__=~\"{}\"}}", &tail[..end]));
        rest = &tail[end..];
    }
    out
}

#[test]
fn metric_selectors_finds_names_and_name_matchers() {
    let s = metric_selectors(
        r#"max by (database) (outbox_relay_leader or (0 * up{job="outbox-relay"})) + sum(rate({__name__=~"(a|b)_total", status=~"5.."}[5m]))"#,
    );
    assert_eq!(
        s,
        ["outbox_relay_leader", "up", r#"{__name__=~"(a|b)_total"}"#]
    );
}
