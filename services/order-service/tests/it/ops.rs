//! `/healthz`, `/metrics`, `/openapi.json`, and shutdown.

use std::time::Duration;

use outbox_process::poll::wait_for;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::TestApp;

#[tokio::test]
async fn health_and_metrics_are_served() {
    let app = TestApp::spawn().await;
    let r = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "ok");
    app.sku("MUG", 1_000).await;
    let text = app.metrics().await;
    for name in [
        "order_http_requests_total{method=\"PUT\",route=\"/skus/{sku_id}\",status=\"200\"} 1",
        "order_http_request_duration_seconds_bucket",
        "order_payments_flagged_for_refund_total{reason=\"order_cancelled\"} 0",
        "order_orders_created_total 0",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}

#[tokio::test]
async fn openapi_describes_every_endpoint() {
    let app = TestApp::spawn().await;
    let r = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for (path, method) in [
        ("/skus/{sku_id}", "put"),
        ("/orders", "post"),
        ("/orders/{order_id}", "get"),
        ("/orders/{order_id}/cancel", "post"),
        ("/orders/{order_id}/deliver", "post"),
        ("/orders/{order_id}/complete", "post"),
        ("/orders/{order_id}/refunds", "post"),
        ("/payments/callback", "post"),
        ("/refunds/callback", "post"),
        ("/channels/marketplace/push", "post"),
        ("/channels/marketplace/compensate", "post"),
        ("/healthz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
    ] {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is not described");
        assert!(
            op["responses"].is_object(),
            "{method} {path} has no responses"
        );
    }
    assert_eq!(doc["paths"].as_object().unwrap().len(), 14);
    // Access control is in the document: bearer JWT on the protected operations with their
    // 401 (and 403 where the operator role is needed), the signed headers on the callbacks.
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"]["scheme"],
        "bearer"
    );
    for (path, method, operator) in [
        ("/orders", "post", false),
        ("/orders/{order_id}", "get", false),
        ("/orders/{order_id}/deliver", "post", true),
        ("/skus/{sku_id}", "put", true),
        ("/channels/marketplace/compensate", "post", true),
    ] {
        let op = &doc["paths"][path][method];
        assert_eq!(
            op["security"][0]["bearerAuth"],
            serde_json::json!([]),
            "{path}"
        );
        assert!(
            op["responses"]["401"].is_object(),
            "{method} {path}: no 401"
        );
        assert_eq!(
            op["responses"]["403"].is_object(),
            operator,
            "{method} {path}: 403"
        );
    }
    for path in ["/payments/callback", "/refunds/callback"] {
        let op = &doc["paths"][path]["post"];
        assert!(
            op["security"].is_null(),
            "{path} is signed, not token-protected"
        );
        assert!(op["responses"]["401"].is_object());
        let headers: Vec<&str> = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] == "header" && p["required"] == true)
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(headers, ["X-Signature", "X-Signature-Timestamp"], "{path}");
    }
    assert!(doc["paths"]["/healthz"]["get"]["security"].is_null());
    // Every documented operation is routed: no `not_found` / 405 for any of them.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let url = app.url(
                &path
                    .replace("{sku_id}", "S1")
                    .replace("{order_id}", "00000000-0000-0000-0000-000000000000"),
            );
            let r = app
                .client
                .request(method.to_uppercase().parse().unwrap(), url)
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body = r.text().await.unwrap();
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert!(
                !body.contains("\"no such route\""),
                "{method} {path} is documented but not routed: {body}"
            );
        }
    }
    // Unknown routes and wrong methods answer the shared envelope.
    let r = app.client.get(app.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "not_found"
    );
    let r = app.client.delete(app.url("/orders")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        r.headers().get("allow").is_some(),
        "405 names the allowed methods"
    );
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "method_not_allowed"
    );
    // Every schema reference resolves.
    let text = doc.to_string();
    for part in text.split("#/components/schemas/").skip(1) {
        let name: String = part.chars().take_while(|c| c.is_alphanumeric()).collect();
        assert!(
            doc["components"]["schemas"][&name].is_object(),
            "dangling $ref {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_drains_a_request_in_flight_and_stops_accepting() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let order = app.order("u1", "MUG", 1).await;
    let id = order["order_id"].as_str().unwrap().to_owned();

    // Hold the order's row lock so the cancel request stays in flight.
    let mut blocker = app.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM orders WHERE order_id = $1::uuid FOR UPDATE")
        .bind(&id)
        .execute(&mut *blocker)
        .await
        .unwrap();
    let in_flight = tokio::spawn({
        let (client, url) = (app.client.clone(), app.url(&format!("/orders/{id}/cancel")));
        async move { client.post(url).send().await }
    });
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'";
    wait_for(
        "the cancel to reach the lock",
        Duration::from_secs(10),
        || async {
            let (n,): (i64,) = sqlx::query_as(waiting).fetch_one(&app.pool).await.unwrap();
            (n > 0).then_some(())
        },
    )
    .await;

    app.shutdown();
    blocker.commit().await.unwrap();
    let r = in_flight
        .await
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        app.event_types(&id).await,
        ["OrderCreated", "OrderCancelled"]
    );
    wait_for(
        "the service to stop accepting after shutdown",
        Duration::from_secs(10),
        || async {
            let refused = app.client.get(app.url("/healthz")).send().await.is_err();
            refused.then_some(())
        },
    )
    .await;
}
