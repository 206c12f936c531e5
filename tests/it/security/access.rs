//! Access control of the WMS and stock APIs, and of the binaries' configuration, end to end:
//! the real processes with their JWT settings. Every warehouse and stock endpoint refuses a
//! missing, expired, forged or foreign token (401 with `WWW-Authenticate: Bearer`) and a
//! customer's token (403), and none of these changes the services' databases; the operator's
//! token works. A service without a token key refuses to start, naming the setting. (The order
//! service's endpoints are covered in its own tests, `services/order-service/tests/it/auth.rs`.)

use std::time::Duration;

use e2e::auth::{JWT_AUDIENCE, JWT_ISSUER, JWT_SECRET};
use e2e::db::fingerprint;
use e2e::fulfilment::System;
use e2e::proc::ServiceProcess;
use outbox_http::auth::Minter;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const WMS_TABLES: [&str; 3] = ["outbounds", "outbound_lines", "order_holds"];
const STOCK_TABLES: [&str; 3] = ["stock", "reservations", "stock_movements"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn warehouse_and_stock_endpoints_need_an_operator_token_and_refusals_change_nothing() {
    let sys = System::start().await;
    sys.sku("A", 500).await;
    sys.set_stock("A", 10).await;
    let order = sys.paid_order("alice", &[("A", 2)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    let no = outbound["outbound_no"].as_str().unwrap().to_owned();
    sys.wait_stock("A", (10, 2)).await;
    sys.wait_outboxes_drained().await;

    let wms = |p: &str| sys.wms.url(p);
    let stock = |p: &str| sys.stock.url(p);
    let ship = json!({ "carrier": "SF", "tracking_no": "SF100" });
    let endpoints: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            wms(&format!("/outbounds/{no}/ship")),
            Some(ship),
        ),
        (
            Method::POST,
            wms(&format!("/outbounds/{no}/return-received")),
            None,
        ),
        (Method::GET, wms(&format!("/outbounds/{no}")), None),
        (
            Method::GET,
            wms(&format!("/outbounds?order_id={order}")),
            None,
        ),
        (
            Method::PUT,
            stock("/stock/A"),
            Some(json!({ "on_hand": 0 })),
        ),
        (Method::GET, stock("/stock/A"), None),
        (Method::GET, stock("/stock"), None),
    ];
    let m = e2e::auth::minter();
    let bad = [
        ("no", None, StatusCode::UNAUTHORIZED, "missing_token"),
        (
            "an expired",
            Some(m.token("ops", &["operator"], -120)),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            "a forged",
            Some(
                Minter::hs256(
                    b"not-the-secret-not-the-secret-xx",
                    JWT_ISSUER,
                    JWT_AUDIENCE,
                )
                .operator("ops"),
            ),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            "another audience's",
            Some(Minter::hs256(JWT_SECRET.as_bytes(), JWT_ISSUER, "another-api").operator("ops")),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            "a customer",
            Some(m.customer("alice")),
            StatusCode::FORBIDDEN,
            "forbidden",
        ),
    ];
    let before = (
        fingerprint(&sys.wms_db.pool, &WMS_TABLES).await,
        fingerprint(&sys.stock_db.pool, &STOCK_TABLES).await,
    );
    let anonymous = reqwest::Client::new();
    for (method, url, body) in &endpoints {
        for (who, token, status, code) in &bad {
            let mut req = anonymous.request(method.clone(), url);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let r = req.send().await.unwrap();
            let case = format!("{method} {url} with {who} token");
            assert_eq!(r.status(), *status, "{case}");
            if *status == StatusCode::UNAUTHORIZED {
                let c = r
                    .headers()
                    .get("www-authenticate")
                    .map(|v| v.to_str().unwrap().to_owned());
                assert!(
                    c.is_some_and(|c| c.starts_with("Bearer ")),
                    "{case}: no Bearer challenge"
                );
            }
            let err: Value = r.json().await.unwrap();
            assert_eq!(err["error"]["code"], *code, "{case}: {err}");
            let after = (
                fingerprint(&sys.wms_db.pool, &WMS_TABLES).await,
                fingerprint(&sys.stock_db.pool, &STOCK_TABLES).await,
            );
            assert_eq!(after, before, "{case} changed a database");
        }
    }
    // Operations endpoints stay open.
    for svc in [&sys.wms, &sys.stock] {
        for path in ["/healthz", "/metrics"] {
            let r = anonymous.get(svc.url(path)).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{} {path}", svc.name);
        }
    }
    // The operator's token ships.
    let (status, body, _) = sys.ship(&no, "SF", "SF100").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    sys.wait_order(&order, "SHIPPED").await;
}

#[tokio::test]
async fn services_without_a_token_key_refuse_to_start_and_say_why() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let no_key = [
        ("JWT_HS256_SECRET", ""),
        ("DATABASE_URL", db.url.as_str()),
        ("KAFKA_BROKERS", brokers.as_str()),
        ("PAYMENT_CALLBACK_SECRET", "s"),
        ("LISTEN_ADDR", "127.0.0.1:0"),
    ];
    for bin in ["order-service", "wms-consumer", "stock-consumer"] {
        let mut p = ServiceProcess::start(bin, &format!("{bin}-no-key"), &[], &no_key);
        let status = e2e::wait_for(&format!("{bin} to exit"), Duration::from_secs(30), || {
            std::future::ready(p.try_wait())
        })
        .await;
        assert!(!status.success(), "{bin} started without a token key");
        let log = p.log_text();
        assert!(
            log.contains("no bearer-token key configured") && log.contains("JWT_HS256_SECRET"),
            "{bin} did not say why: {log}"
        );
    }
}
