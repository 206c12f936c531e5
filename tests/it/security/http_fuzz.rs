//! Property tests of every HTTP API in-process: each service's router driven with
//! `tower::ServiceExt::oneshot` over a real, migrated test database, with requests built from
//! hostile parts (NUL bytes and bad percent-encoding in path segments, over-long and non-ASCII
//! strings, wrong JSON types, integral and fractional floats, extra properties, arbitrary
//! bytes, missing and wrong headers). Callback and push bodies are also sent correctly signed,
//! so their parsers are reached past the signature check, and with no, an operator's, a
//! customer's, an expired and a malformed bearer token.
//!
//! For any request: no 5xx; every refusal (4xx) is the shared JSON envelope with a `code`; and
//! a refused request changed nothing (the database fingerprint is the same before and after).

use std::future::Future;

use axum::body::{to_bytes, Body};
use axum::http::Request;
use axum::Router;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt;

use e2e::db::{fingerprint_all, fresh_database};

/// Cases per service: each one is a request and two fingerprints of the database.
const CASES: u32 = 150;

const CALLBACK_SECRET: &str = "fuzz-callback-secret";
const MARKETPLACE_SECRET: &str = "fuzz-marketplace-secret";

/// A path segment: plausible ids, and what must never reach SQL raw.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("S1".to_owned()),
        Just("OB0000000001".to_owned()),
        Just("00000000-0000-0000-0000-000000000000".to_owned()),
        Just("%00abc".to_owned()),
        Just("%FF%FE".to_owned()),
        Just("a%2Fb".to_owned()),
        "[A-Za-z0-9._:-]{0,70}",
        ".{0,20}".prop_map(|s| percent_encode(&s)),
        "x{200,300}",
    ]
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A JSON value of any type, leaning on the edges the validators guard.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just(1.0f64),
            Just(159_509.0),
            Just(2.5),
            Just(1e300),
            Just(-0.0)
        ]
        .prop_map(Value::from),
        Just(json!(10_000_000_000_001i64)),
        Just(json!(9_007_199_254_740_993u64)),
        ".{0,10}".prop_map(Value::from),
        "[\\x00-\\x1f]{1,3}".prop_map(Value::from),
        "y{129,600}".prop_map(Value::from),
        Just(Value::from("SUCCESS")),
        Just(Value::from("TradeSync")),
        Just(Value::from("RefundSync")),
        Just(Value::from("REFUND_ONLY")),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..3).prop_map(Value::from),
            vec((field(), inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Field names the services read, and others.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "user_id", "items", "sku_id", "quantity", "name", "price_cents", "refund_no",
            "amount_cents", "reason", "kind", "order_id", "transaction_id", "status",
            "modified", "msg_id", "type", "trade", "refund", "tid", "buyer_id", "paid_cents",
            "refund_id", "refund_cents", "carrier", "tracking_no", "on_hand",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,8}",
    ]
}

/// A body: a JSON object of known and unknown fields, any JSON, or arbitrary bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => vec((field(), json_value()), 0..8)
            .prop_map(|kv| serde_json::to_vec(&Value::Object(kv.into_iter().collect())).unwrap()),
        1 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => vec(any::<u8>(), 0..64),
    ]
}

/// One request: method, path from `templates` (each `{}` a segment), optional query, headers,
/// body, and whether to sign the body.
#[derive(Debug, Clone)]
struct Case {
    method: &'static str,
    path: String,
    idempotency_key: Option<String>,
    body: Vec<u8>,
    signed: bool,
    token: Token,
}

/// Who the request claims to be.
#[derive(Debug, Clone, Copy)]
enum Token {
    None,
    Operator,
    Customer,
    Expired,
    Garbage,
}

fn bearer(token: Token) -> Option<String> {
    match token {
        Token::None => None,
        Token::Operator => Some(e2e::auth::operator()),
        Token::Customer => Some(e2e::auth::customer("fuzz-user")),
        Token::Expired => Some(e2e::auth::minter().token("fuzz-user", &[], -3600)),
        Token::Garbage => Some("not.a.jwt".to_owned()),
    }
}

fn case(templates: &'static [&'static str]) -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec!["GET", "PUT", "POST", "DELETE", "PATCH"]),
        prop::sample::select(templates.to_vec()),
        vec(segment(), 2),
        prop::option::of(prop_oneof![
            segment(),
            Just("00000000-0000-0000-0000-000000000000".to_owned())
        ]),
        prop::option::of("[ -~]{0,140}"),
        body(),
        any::<bool>(),
        prop::sample::select(vec![
            Token::None,
            Token::Operator,
            Token::Operator,
            Token::Customer,
            Token::Customer,
            Token::Expired,
            Token::Garbage,
        ]),
    )
        .prop_map(
            |(method, template, segs, query, idempotency_key, body, signed, token)| {
                let mut path = template.to_owned();
                for s in &segs {
                    path = path.replacen("{}", s, 1);
                }
                if let Some(q) = query {
                    path.push_str("?order_id=");
                    path.push_str(&q);
                }
                Case {
                    method,
                    path,
                    idempotency_key,
                    body,
                    signed,
                    token,
                }
            },
        )
}

fn request(c: &Case, secret: Option<&str>) -> Option<Request<Body>> {
    let mut b = Request::builder()
        .method(c.method)
        .uri(&c.path)
        .header("content-type", "application/json");
    if let Some(k) = &c.idempotency_key {
        b = b.header("idempotency-key", k);
    }
    if let Some(t) = bearer(c.token) {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    if let (true, Some(secret)) = (c.signed, secret) {
        let secret = order_service::CallbackSecret::new(secret).unwrap();
        // Callbacks sign `<timestamp>.<body>`; pushes the body alone.
        let now = chrono::Utc::now().timestamp();
        let sig = if c.path.starts_with("/channels/") {
            secret.sign(&c.body)
        } else {
            secret.sign_at(now, &c.body)
        };
        b = b
            .header("x-signature-timestamp", now.to_string())
            .header("x-signature", sig);
    }
    // A path the URI parser refuses never reaches the server.
    b.body(Body::from(c.body.clone())).ok()
}

/// Runs `CASES` requests against `router`; `secret_for` picks the signing secret by path.
fn check_router(
    name: &str,
    rt: &tokio::runtime::Runtime,
    router: Router,
    pool: &PgPool,
    templates: &'static [&'static str],
    secret_for: fn(&str) -> Option<&'static str>,
) {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(templates), |c| {
        let Some(req) = request(&c, secret_for(&c.path)) else {
            return Ok(());
        };
        block(rt, async {
            let before = fingerprint_all(pool).await;
            let response = router.clone().oneshot(req).await.unwrap();
            let status = response.status();
            let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
            prop_assert!(
                !status.is_server_error(),
                "{name}: {c:?} answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
            if status.is_client_error() {
                let body: Value = serde_json::from_slice(&bytes).map_err(|e| {
                    TestCaseError::fail(format!("{name}: {c:?}: {status} is not JSON: {e}"))
                })?;
                prop_assert!(
                    body["error"]["code"].is_string(),
                    "{name}: {c:?}: {status} without the envelope: {body}"
                );
                prop_assert_eq!(
                    before,
                    fingerprint_all(pool).await,
                    "{}: {:?} was refused ({}) but changed the database",
                    name,
                    c,
                    status
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

fn block<F: Future>(rt: &tokio::runtime::Runtime, f: F) -> F::Output {
    rt.block_on(f)
}

#[test]
fn any_request_to_any_service_is_answered_without_5xx_and_refusals_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // Stock: a SKU to find.
    let stock_db = rt.block_on(fresh_database());
    rt.block_on(stock_consumer::migrator().run(&stock_db.pool))
        .unwrap();
    rt.block_on(
        sqlx::query("INSERT INTO stock (sku_id, on_hand, reserved) VALUES ('S1', 5, 0)")
            .execute(&stock_db.pool),
    )
    .unwrap();
    let auth = outbox_http::auth::Authenticator::hs256(
        e2e::auth::JWT_SECRET.as_bytes(),
        e2e::auth::JWT_ISSUER,
        e2e::auth::JWT_AUDIENCE,
    );
    let stock = stock_consumer::router(stock_consumer::AppState {
        pool: stock_db.pool.clone(),
        metrics: stock_consumer::Metrics::new("stock", "stock-fuzz"),
    })
    .layer(axum::Extension(auth.clone()));
    check_router(
        "stock-consumer",
        &rt,
        stock,
        &stock_db.pool,
        &["/stock/{}", "/stock", "/{}", "/stock/{}/{}"],
        |_| None,
    );

    // WMS: an outbound to act on.
    let wms_db = rt.block_on(fresh_database());
    rt.block_on(wms_consumer::migrator().run(&wms_db.pool))
        .unwrap();
    rt.block_on(
        sqlx::query(
            "INSERT INTO outbounds (outbound_no, order_id, status) \
             VALUES ('OB0000000001', '00000000-0000-0000-0000-000000000000', 'CREATED')",
        )
        .execute(&wms_db.pool),
    )
    .unwrap();
    let wms = wms_consumer::router(wms_consumer::AppState {
        pool: wms_db.pool.clone(),
        metrics: wms_consumer::Metrics::new("wms", "wms-fuzz"),
    })
    .layer(axum::Extension(auth.clone()));
    check_router(
        "wms-consumer",
        &rt,
        wms,
        &wms_db.pool,
        &[
            "/outbounds/{}",
            "/outbounds/{}/ship",
            "/outbounds/{}/return-received",
            "/outbounds",
            "/{}/{}",
        ],
        |_| None,
    );

    // Orders: a SKU in the catalog; callbacks and pushes signed half the time.
    let order_db = rt.block_on(fresh_database());
    rt.block_on(order_service::migrate(&order_db.pool)).unwrap();
    rt.block_on(
        sqlx::query("INSERT INTO skus (sku_id, name, price_cents) VALUES ('S1', 'Mug', 1000)")
            .execute(&order_db.pool),
    )
    .unwrap();
    let order = order_service::router(order_service::AppState {
        pool: order_db.pool.clone(),
        metrics: order_service::Metrics::new(),
        secret: order_service::CallbackSecret::new(CALLBACK_SECRET).unwrap(),
        marketplace_secret: Some(order_service::CallbackSecret::new(MARKETPLACE_SECRET).unwrap()),
        marketplace: None,
        replay_window: outbox_http::signature::DEFAULT_REPLAY_WINDOW,
        auth,
    });
    check_router(
        "order-service",
        &rt,
        order,
        &order_db.pool,
        &[
            "/skus/{}",
            "/orders",
            "/orders/{}",
            "/orders/{}/cancel",
            "/orders/{}/refunds",
            "/payments/callback",
            "/refunds/callback",
            "/channels/marketplace/push",
            "/channels/marketplace/compensate",
            "/{}",
        ],
        |path| match path {
            "/payments/callback" | "/refunds/callback" => Some(CALLBACK_SECRET),
            "/channels/marketplace/push" => Some(MARKETPLACE_SECRET),
            _ => None,
        },
    );
}
