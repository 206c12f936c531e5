//! Failing messages in the running consumers (the order service, the WMS consumer and the
//! stock consumer as processes, each with its own database and relay): a database that fails
//! is retried on the same message until it applies, once; messages that can never apply
//! (missing headers, undecodable, an unknown version, unapplicable) go to the dead-letter
//! topic with their source and reason, and the messages behind them are applied.

use std::collections::HashMap;
use std::time::Duration;

use e2e::fulfilment::{count, metric, produce_all, Produce, System, PARTITIONS};
use e2e::verify::dump;
use serde_json::json;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_database_is_retried_on_the_same_message_until_it_applies() {
    let sys = System::start().await;
    sys.sku("F1", 100).await;
    sys.set_stock("F1", 10).await;
    // The stock consumer's statements fail (undefined table) until the table is back.
    sqlx::query("ALTER TABLE reservations RENAME TO reservations_away")
        .execute(&sys.stock_db.pool)
        .await
        .unwrap();
    let order = sys.paid_order("judy", &[("F1", 1)]).await;
    e2e::wait_for(
        "the stock consumer to retry",
        Duration::from_secs(60),
        || async {
            (metric(&sys.stock.metrics().await, "consumer_retries_total", &[]) >= 3.0).then_some(())
        },
    )
    .await;
    assert!(sys.outbounds_of(&order).await.is_empty());
    sqlx::query("ALTER TABLE reservations_away RENAME TO reservations")
        .execute(&sys.stock_db.pool)
        .await
        .unwrap();
    sys.wait_outbound(&order, "CREATED").await;
    sys.wait_stock("F1", (10, 1)).await;
    let m = sys.stock.metrics().await;
    assert_eq!(
        metric(&m, "consumer_messages_total", &[("outcome", "applied")]),
        1.0,
        "applied once"
    );
    assert_eq!(
        metric(
            &m,
            "consumer_messages_total",
            &[("outcome", "dead_lettered")]
        ),
        0.0,
        "nothing discarded"
    );
    assert_eq!(
        count(&sys.stock_db.pool, "SELECT count(*) FROM inbox").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_messages_go_to_the_dead_letter_topic_and_later_ones_are_applied() {
    let sys = System::start().await;
    sys.sku("P1", 100).await;
    sys.set_stock("P1", 10).await;
    let topic = sys.topic("order");
    let h = |pairs: &[(&str, String)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    };
    let mut poison: Vec<Produce> = vec![];
    for p in 0..PARTITIONS {
        let key = format!("poison-{p}");
        let paid = json!({"order_id": Uuid::new_v4(), "items": [{"sku_id": "P1", "quantity": 1}]})
            .to_string();
        poison.push((
            topic.clone(),
            key.clone(),
            paid.clone(),
            h(&[("event_type", "OrderPaid".into())]),
            Some(p),
        ));
        poison.push((
            topic.clone(),
            key.clone(),
            "not json".into(),
            h(&[
                ("event_id", Uuid::new_v4().to_string()),
                ("event_type", "OrderPaid".into()),
            ]),
            Some(p),
        ));
        poison.push((
            topic.clone(),
            key.clone(),
            paid,
            h(&[
                ("event_id", Uuid::new_v4().to_string()),
                ("event_type", "OrderPaid".into()),
                ("event_version", "99".into()),
            ]),
            Some(p),
        ));
        poison.push((
            topic.clone(),
            key,
            r#"{"order_id": 42}"#.into(),
            h(&[
                ("event_id", Uuid::new_v4().to_string()),
                ("event_type", "OrderPaid".into()),
            ]),
            Some(p),
        ));
    }
    produce_all(&sys.brokers, poison).await;

    // Behind the poison in every partition: a real order, applied.
    let order = sys.paid_order("ivan", &[("P1", 1)]).await;
    sys.wait_outbound(&order, "CREATED").await;
    sys.wait_stock("P1", (10, 1)).await;

    let dead = |m: String| -> f64 {
        metric(
            &m,
            "consumer_messages_total",
            &[("outcome", "dead_lettered")],
        )
    };
    e2e::wait_for(
        "every poison message dead-lettered",
        Duration::from_secs(60),
        || async {
            (dead(sys.stock.metrics().await) == 12.0 && dead(sys.wms.metrics().await) == 3.0)
                .then_some(())
        },
    )
    .await;
    let records = tokio::task::spawn_blocking({
        let brokers = sys.brokers.clone();
        let dlq = format!("{topic}.dlq");
        move || dump(&brokers, &[dlq])
    })
    .await
    .unwrap();
    let mut by: HashMap<(String, String), usize> = HashMap::new();
    for r in &records {
        let get = |k: &str| r.headers.get(k).cloned().unwrap_or_default();
        assert!(!get("dlq.error").is_empty(), "{r:?}");
        assert_eq!(get("dlq.source.topic"), topic);
        assert!(
            get("dlq.source.partition")
                .parse::<i32>()
                .is_ok_and(|p| (0..PARTITIONS).contains(&p)),
            "{r:?}"
        );
        assert!(get("dlq.source.offset").parse::<i64>().is_ok(), "{r:?}");
        assert!(
            r.key.as_deref().is_some_and(|k| k.starts_with("poison-")),
            "{r:?}"
        );
        *by.entry((get("dlq.consumer"), get("dlq.reason")))
            .or_default() += 1;
    }
    let expected: HashMap<(String, String), usize> = [
        (("stock", "missing_header"), 3),
        (("stock", "undecodable"), 3),
        (("stock", "unknown_version"), 3),
        (("stock", "unapplicable"), 3),
        (("wms", "missing_header"), 3),
    ]
    .into_iter()
    .map(|((c, r), n)| ((c.to_owned(), r.to_owned()), n))
    .collect();
    assert_eq!(by, expected, "dead letters by consumer and reason");
    let sample = records
        .iter()
        .find(|r| r.headers.get("dlq.reason").map(String::as_str) == Some("unknown_version"))
        .unwrap();
    assert!(
        sample.headers["dlq.error"].contains("unknown version 99 of OrderPaid"),
        "{:?}",
        sample.headers
    );
    assert_eq!(
        count(&sys.stock_db.pool, "SELECT count(*) FROM reservations").await,
        1,
        "only the real order"
    );
}
