//! The compensation pass against a platform whose answer cannot be trusted: a watermark far in
//! the future is refused, nothing of the answer is applied and the stored watermark stays.

use axum::routing::get;
use axum::{Json, Router};
use order_service::channel::client::ClientError;
use order_service::channel::compensation::{run_once, CompensationError};
use order_service::channel::PlatformClient;
use order_service::Metrics;
use serde_json::{json, Value};

use crate::support::TestApp;

/// A platform whose query API answers `answer` to every `GET /query/changes`.
async fn platform(answer: Value) -> String {
    let app = Router::new().route(
        "/query/changes",
        get(move || {
            let answer = answer.clone();
            async move { Json(answer) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

#[tokio::test]
async fn a_watermark_beyond_now_is_refused_and_the_stored_watermark_stays() {
    let app = TestApp::spawn().await;
    sqlx::query(
        "INSERT INTO channel_watermarks (channel, modified_ms) VALUES ('marketplace', 1000)",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let tomorrow = chrono::Utc::now().timestamp_millis() + 86_400_000;
    let base = platform(json!({
        "messages": [{
            "msg_id": "m-future", "type": "TradeSync", "modified": 2000,
            "trade": {"tid": "T-future", "status": "WAIT_SELLER_SEND_GOODS", "buyer_id": "b-1",
                      "items": [{"sku_id": "MUG", "quantity": 1}], "paid_cents": 1_000}
        }],
        "until": tomorrow,
    }))
    .await;
    let e = run_once(&app.pool, &PlatformClient::new(&base), &Metrics::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, CompensationError::Platform(ClientError::FutureWatermark { until_ms, .. }) if *until_ms == tomorrow),
        "{e:?}"
    );
    let watermark: i64 = sqlx::query_scalar(
        "SELECT modified_ms FROM channel_watermarks WHERE channel = 'marketplace'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(watermark, 1000, "the watermark did not move");
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM channel_orders")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(orders, 0, "nothing of the refused answer was applied");
}
