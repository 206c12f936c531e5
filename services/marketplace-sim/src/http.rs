//! The platform's routes.
//!
//! | route | what |
//! |---|---|
//! | `POST /trades` `{tid, buyer_id, items, paid_cents, pay}` | a buyer places (and pays) a trade |
//! | `POST /trades/{tid}/refunds` `{refund_id, refund_cents, kind, statuses, amounts?, items?, same_modified?}` | a refund goes through `statuses` (each at its amount in `amounts`, all at one `modified` with `same_modified`), taking back `items` (`[{sku_id, quantity}]`, default the whole trade) |
//! | `POST /trades/{tid}/finish` | the buyer confirms receipt |
//! | `GET /trades`, `GET /trades/{tid}` | latest snapshots |
//! | `GET /query/changes?since=MS` | the query API: `{messages, until}` |
//! | `POST /ship` `{tid, out_sid, company}` | the ship API |
//! | `GET /calls` | every push and ship call, counted |
//! | `GET /admin/faults`, `PUT /admin/faults` | fault settings |
//! | `GET /healthz` | liveness |

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::config::Faults;
use crate::platform::{Item, Platform, PlatformError, RefundStep, ShipOutcome};

/// The whole API.
pub fn router(platform: Platform) -> Router {
    Router::new()
        .route("/trades", post(create_trade).get(trades))
        .route("/trades/{tid}", get(trade))
        .route("/trades/{tid}/refunds", post(refund))
        .route("/trades/{tid}/finish", post(finish))
        .route("/query/changes", get(changes))
        .route("/ship", post(ship))
        .route("/calls", get(calls))
        .route("/admin/faults", get(faults).put(set_faults))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(platform)
}

fn error(e: PlatformError) -> Response {
    match e {
        PlatformError::UnknownTrade => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": {"code": "unknown_trade"}})),
        )
            .into_response(),
        PlatformError::Conflict(m) => (
            StatusCode::CONFLICT,
            Json(json!({"error": {"code": "conflict", "message": m}})),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct NewTrade {
    tid: String,
    buyer_id: String,
    items: Vec<Item>,
    paid_cents: i64,
    #[serde(default = "yes")]
    pay: bool,
}

fn yes() -> bool {
    true
}

async fn create_trade(State(p): State<Platform>, Json(t): Json<NewTrade>) -> Response {
    match p
        .create_trade(t.tid, t.buyer_id, t.items, t.paid_cents, t.pay)
        .await
    {
        Ok(t) => (StatusCode::CREATED, Json(t)).into_response(),
        Err(e) => error(e),
    }
}

async fn trades(State(p): State<Platform>) -> Response {
    Json(p.trades()).into_response()
}

async fn trade(State(p): State<Platform>, Path(tid): Path<String>) -> Response {
    match p.trade(&tid) {
        Some(t) => Json(t).into_response(),
        None => error(PlatformError::UnknownTrade),
    }
}

#[derive(Debug, Deserialize)]
struct NewRefund {
    refund_id: String,
    refund_cents: i64,
    #[serde(default = "return_and_refund")]
    kind: String,
    statuses: Vec<String>,
    /// The amount of each snapshot (default: `refund_cents` for all).
    #[serde(default)]
    amounts: Option<Vec<i64>>,
    /// The lines a return-and-refund takes back, in every snapshot (default: none, the
    /// whole trade).
    #[serde(default)]
    items: Vec<crate::platform::Item>,
    /// Every snapshot with the same `modified`.
    #[serde(default)]
    same_modified: bool,
}

fn return_and_refund() -> String {
    "RETURN_AND_REFUND".to_owned()
}

async fn refund(
    State(p): State<Platform>,
    Path(tid): Path<String>,
    Json(r): Json<NewRefund>,
) -> Response {
    let amounts = r
        .amounts
        .unwrap_or_else(|| vec![r.refund_cents; r.statuses.len()]);
    if amounts.len() != r.statuses.len() {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": {"code": "invalid", "field": "amounts",
                "message": "one amount per status"}})),
        )
            .into_response();
    }
    let steps = r
        .statuses
        .into_iter()
        .zip(amounts)
        .map(|(status, refund_cents)| RefundStep {
            status,
            refund_cents,
            items: r.items.clone(),
        })
        .collect();
    match p
        .refund(&tid, r.refund_id, r.kind, steps, r.same_modified)
        .await
    {
        Ok(t) => Json(t).into_response(),
        Err(e) => error(e),
    }
}

async fn finish(State(p): State<Platform>, Path(tid): Path<String>) -> Response {
    match p.finish(&tid).await {
        Ok(t) => Json(t).into_response(),
        Err(e) => error(e),
    }
}

#[derive(Debug, Deserialize)]
struct Since {
    #[serde(default)]
    since: i64,
}

async fn changes(State(p): State<Platform>, Query(q): Query<Since>) -> Response {
    let (messages, until) = p.changes_since(q.since);
    Json(json!({"messages": messages, "until": until})).into_response()
}

#[derive(Debug, Deserialize)]
struct ShipRequest {
    tid: String,
    out_sid: String,
}

async fn ship(State(p): State<Platform>, Json(r): Json<ShipRequest>) -> Response {
    let outcome = p.ship(&r.tid, &r.out_sid).await;
    let delay = p.faults().ship_delay_ms;
    if delay > 0 {
        // The fault itself: a slow platform.
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    let (status, result) = match outcome {
        ShipOutcome::Shipped => (StatusCode::OK, json!({"result": "shipped"})),
        ShipOutcome::AlreadyShipped => (StatusCode::OK, json!({"result": "already_shipped"})),
        ShipOutcome::Failed => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"code": "busy"}}),
        ),
        ShipOutcome::Refused => (
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"error": {"code": "refused", "message": "the platform refuses this shipment"}}),
        ),
        ShipOutcome::Conflict(m) => (
            StatusCode::CONFLICT,
            json!({"error": {"code": "conflict", "message": m}}),
        ),
        ShipOutcome::UnknownTrade => (
            StatusCode::NOT_FOUND,
            json!({"error": {"code": "unknown_trade"}}),
        ),
    };
    (status, Json(result)).into_response()
}

async fn calls(State(p): State<Platform>) -> Response {
    Json(p.calls()).into_response()
}

async fn faults(State(p): State<Platform>) -> Response {
    Json(p.faults()).into_response()
}

async fn set_faults(State(p): State<Platform>, Json(f): Json<Faults>) -> Response {
    p.set_faults(f);
    Json(p.faults()).into_response()
}
