//! Retention: rows past their window go in bounded batches from a background task while the
//! service keeps serving; rows inside the window stay.

use std::time::Duration;

use e2e::proc::{metric_series, RelayArgs, RelayProcess, ServiceProcess};
use serde_json::json;

const OLD_KEYS: i64 = 300_000;
const BATCH: i64 = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn old_idempotency_keys_are_purged_in_bounded_batches_while_the_service_serves() {
    let db = e2e::db::fresh_database().await;
    let addr = format!("127.0.0.1:{}", e2e::free_port());
    let service = ServiceProcess::start(
        "order-service",
        "order-retention",
        &["--listen", &addr, "--database-url", &db.url],
        &[
            ("PAYMENT_CALLBACK_SECRET", "retention-secret"),
            ("RETENTION_BATCH_ROWS", &BATCH.to_string()),
            ("RETENTION_PAUSE_MS", "50"),
            ("RETENTION_INTERVAL_S", "2"),
        ],
    );
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    crate::common::serving_with_a_lamp(&http, &base).await;

    // Keys two days old (past the default 24 h) and one fresh key of the same shape.
    sqlx::query(
        "INSERT INTO idempotency_keys (user_id, idempotency_key, request_hash, created_at) \
         SELECT 'old-user', 'k-' || g, '\\x00'::bytea, now() - interval '2 days' \
         FROM generate_series(1, $1) g",
    )
    .bind(OLD_KEYS)
    .execute(&db.pool)
    .await
    .unwrap();

    // Keep serving orders while the purge runs; every request must succeed.
    let mut orders = 0u32;
    let mut pending_seen = Vec::new();
    let metrics_of = |text: &str, name: &str| {
        metric_series(text, &format!("{name}{{table=\"idempotency_keys\"}}")).unwrap_or(0.0)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let (deleted, batches) = loop {
        let r = http
            .post(format!("{base}/orders"))
            .header("Idempotency-Key", format!("during-purge-{orders}"))
            .bearer_auth(e2e::auth::customer("u-1"))
            .json(&json!({"items": [{"sku_id": "sku-1", "quantity": 1}]}))
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "POST /orders during the purge: {}",
            r.status()
        );
        orders += 1;
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let pending = metrics_of(&text, "retention_rows_pending");
        pending_seen.push(pending);
        let deleted = metrics_of(&text, "retention_rows_deleted_total");
        if deleted >= OLD_KEYS as f64 && pending == 0.0 {
            break (deleted, metrics_of(&text, "retention_batches_total"));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "purge not done: deleted {deleted}, pending {pending}\n{}",
            service.log_text()
        );
    };
    assert_eq!(deleted, OLD_KEYS as f64, "only the old keys were deleted");
    // Bounded: no DELETE removed more than a batch.
    assert!(
        batches >= (OLD_KEYS / BATCH) as f64,
        "{batches} DELETEs for {deleted} rows: some removed more than {BATCH}"
    );
    // The purge was seen in progress while requests were answered.
    assert!(
        pending_seen
            .iter()
            .any(|p| *p > 0.0 && *p < OLD_KEYS as f64),
        "never saw the purge in progress: {pending_seen:?}"
    );
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE user_id = 'old-user'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(left, 0);
    let fresh: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE user_id = 'u-1'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(fresh, i64::from(orders), "keys inside the window are kept");
    eprintln!("purged {deleted} keys in {batches} DELETEs while {orders} orders were created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leading_relay_purges_old_discarded_events_and_the_consumer_its_inbox() {
    let db = e2e::db::fresh_database().await;
    outbox_writer::schema::migrate_inbox(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_discarded (event_id, outbox_id, aggregate_type, aggregate_id, \
             event_type, payload, headers, created_at, error_class, error_message, attempts, \
             reason, discarded_by, discarded_at) \
         SELECT gen_random_uuid(), g, 'order', g::text, 'E', '{}', '{}', now(), 'refused', 'x', \
                1, 'test', 'e2e', now() - CASE WHEN g <= 20000 THEN interval '100 days' ELSE interval '1 day' END \
         FROM generate_series(1, 20010) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let mut args = RelayArgs::new(
        &db.url,
        &e2e::kafka_brokers(),
        &e2e::unique_topic_prefix(),
        "retention-relay",
    );
    args.extra = vec!["--retention-batch-rows".into(), "1000".into()];
    let relay = RelayProcess::start(&args);
    let batches = e2e::wait_for(
        "the relay to purge old discarded events",
        Duration::from_secs(60),
        || async {
            let text = relay.metrics().await?;
            let deleted = metric_series(
                &text,
                "retention_rows_deleted_total{table=\"outbox_discarded\"}",
            )?;
            (deleted >= 20_000.0).then(|| {
                metric_series(&text, "retention_batches_total{table=\"outbox_discarded\"}")
                    .unwrap_or(0.0)
            })
        },
    )
    .await;
    assert!(batches >= 20.0, "{batches} DELETEs of at most 1000 rows");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_discarded")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 10, "rows inside the 90-day window stay");

    // The consumer runtime forgets its own inbox rows past the window, not another's.
    sqlx::query(
        "INSERT INTO inbox (consumer_name, event_id, processed_at) \
         SELECT CASE WHEN g % 2 = 0 THEN 'probe' ELSE 'other' END, gen_random_uuid(), \
                now() - interval '30 days' \
         FROM generate_series(1, 20000) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let registry = prometheus::Registry::new();
    let metrics = outbox_consumer::ConsumerMetrics::register(&registry, "probe").unwrap();
    let rule = outbox_process::retention::RetentionRule {
        table: "inbox",
        time_column: "processed_at",
        scope: Some(("consumer_name", "probe".into())),
        window: Duration::from_secs(14 * 86_400),
    };
    let settings = outbox_process::retention::PurgeSettings {
        batch_rows: 1_000,
        ..Default::default()
    };
    let removed = outbox_process::retention::purge(
        &db.pool,
        &rule,
        settings,
        &metrics.retention,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(removed, 10_000);
    assert_eq!(
        metrics
            .retention
            .batches
            .with_label_values(&["inbox"])
            .get(),
        11,
        "ten full batches and a short one"
    );
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT consumer_name, count(*) FROM inbox GROUP BY 1 ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(left, vec![("other".to_owned(), 10_000)]);
}
