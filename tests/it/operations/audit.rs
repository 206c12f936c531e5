//! `outbox-audit` against the whole running system: a clean run reports no violation, then
//! five planted defects are each found and named (a deleted outbound, a doubled stock
//! movement, an event missing from a consumer's inbox behind its committed offset, two events
//! of one aggregate swapped on a topic by kafka-python, an unpublished row past the threshold),
//! and nothing else is reported.

use std::time::Duration;

use e2e::audit::{create_topics, install_ledgers, run, AuditRun};
use e2e::fulfilment::{produce, System, PARTITIONS};
use serde_json::Value;

/// Runs the audit until every consumer's committed offsets reached the end of its topics.
async fn audit_caught_up(sys: &System, extra: &[&str]) -> AuditRun {
    e2e::audit::run_caught_up(sys, extra, Duration::from_secs(60)).await
}

fn ids(vs: &[Value], field: &str) -> Vec<String> {
    vs.iter()
        .map(|v| v[field].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_is_clean_on_a_drained_system_and_names_each_planted_defect() {
    let sys = System::start().await;
    install_ledgers(&sys).await;
    sys.sku("lamp", 2_500).await;
    sys.set_stock("lamp", 100).await;
    let mut orders = Vec::new();
    for n in 0..4 {
        orders.push(sys.paid_order(&format!("u{n}"), &[("lamp", 2)]).await);
    }
    for o in &orders {
        sys.wait_outbound(o, "CREATED").await;
    }
    // One shipped, one refunded before shipping: more event kinds on every topic.
    let shipped = sys.outbounds_of(&orders[2]).await[0]["outbound_no"]
        .as_str()
        .unwrap()
        .to_owned();
    let (s, body, _) = sys.ship(&shipped, "DHL", "T-audit-1").await;
    assert!(s.is_success(), "{body}");
    sys.wait_order(&orders[2], "SHIPPED").await;
    sys.request_refund(&orders[3], "rf-audit-3").await;
    sys.wait_outbound(&orders[3], "INTERCEPTED").await;
    sys.refund_outcome("rf-audit-3", "SUCCESS").await;
    sys.wait_outbound(&orders[3], "CANCELLED").await;
    sys.wait_order(&orders[3], "REFUNDED").await;
    sys.wait_stock("lamp", (98, 4)).await;
    sys.wait_outboxes_drained().await;

    let settled = ["--settle-s", "0", "--max-unpublished-age-s", "600"];
    let clean = audit_caught_up(&sys, &settled).await;
    eprintln!("clean audit: {}", clean.report);
    assert_eq!(
        clean.code, 0,
        "a clean system audits clean: {}",
        clean.report
    );
    assert!(clean.violations().is_empty());
    assert_eq!(clean.count("orders_paid"), 4);
    assert_eq!(clean.count("outbounds"), 4);
    assert_eq!(clean.count("reservations"), 4);
    assert!(clean.count("broker.messages") > 0);
    assert!(clean.count("ledger.published_events_checked") > 10);
    for c in ["order", "wms", "stock"] {
        assert!(
            clean.count(&format!("consumer.{c}.messages_checked")) > 0,
            "{c}'s messages are checked against its inbox"
        );
    }

    // 1. A deleted outbound.
    let lost_outbound = orders[0].clone();
    sqlx::raw_sql(&format!(
        "DELETE FROM outbound_lines WHERE outbound_no IN (SELECT outbound_no FROM outbounds WHERE order_id = '{lost_outbound}'); \
         DELETE FROM outbounds WHERE order_id = '{lost_outbound}'"
    ))
    .execute(&sys.wms_db.pool)
    .await
    .unwrap();

    // 2. A doubled stock movement (the unique key gone, the effect applied twice).
    let doubled = orders[1].clone();
    sqlx::raw_sql(&format!(
        "DROP INDEX stock_movements_reserve_and_deduct_once; \
         INSERT INTO stock_movements (order_id, sku_id, kind, quantity, event_id) \
             SELECT order_id, sku_id, kind, quantity, event_id FROM stock_movements \
             WHERE order_id = '{doubled}' AND kind = 'RESERVE'; \
         UPDATE stock SET reserved = reserved + 2 WHERE sku_id = 'lamp'"
    ))
    .execute(&sys.stock_db.pool)
    .await
    .unwrap();

    // 3. An event the WMS applied, gone from its inbox (behind its committed offset).
    let forgotten: String = sqlx::query_scalar(
        "DELETE FROM inbox WHERE event_id = (SELECT event_id FROM inbox WHERE consumer_name = 'wms' \
         ORDER BY processed_at LIMIT 1) RETURNING event_id::text",
    )
    .fetch_one(&sys.wms_db.pool)
    .await
    .unwrap();

    // 4. Two events of one aggregate on its topic in the wrong order: the ledger says outbox
    //    ids 9_000_000_001 then 9_000_000_002, kafka-python produces the second first.
    let (first, second) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    for (id, ev) in [(9_000_000_001_i64, first), (9_000_000_002, second)] {
        sqlx::query(
            "INSERT INTO outbox_ledger (outbox_id, event_id, aggregate_type, aggregate_id, event_type, created_at) \
             VALUES ($1, $2, 'probe', 'probe-1', 'Probed', now())",
        )
        .bind(id)
        .bind(ev)
        .execute(&sys.order_db.pool)
        .await
        .unwrap();
    }
    let probe_topic = sys.topic("probe");
    let brokers = sys.brokers.clone();
    let t = probe_topic.clone();
    tokio::task::spawn_blocking(move || {
        create_topics(&brokers, PARTITIONS, &[&t]);
        for ev in [second, first] {
            let e = ev.to_string();
            let headers = [("id".to_owned(), e.clone()), ("event_id".to_owned(), e)];
            produce(&brokers, &t, "probe-1", "{}", &headers, None);
        }
    })
    .await
    .unwrap();

    // 5. An event that cannot be published (its topic name is invalid: the relay parks it),
    //    written two hours ago.
    let stale: (i64, String) = sqlx::query_as(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, topic, created_at) \
         VALUES ('stock', 'stale-1', 'Probed', '{}', 'not a topic!', now() - interval '2 hours') \
         RETURNING id, event_id::text",
    )
    .fetch_one(&sys.stock_db.pool)
    .await
    .unwrap();

    let found = run(&sys, &sys.brokers, &settled).await;
    eprintln!("audit with planted defects: {}", found.report);
    assert_eq!(found.code, 1, "violations exit 1: {}", found.stderr);

    let missing = found.of_kind("missing_outbound");
    assert_eq!(ids(&missing, "order_id"), [lost_outbound]);

    let dup = found.of_kind("duplicate_stock_movement");
    assert_eq!(ids(&dup, "order_id"), [doubled.as_str()]);
    assert_eq!(dup[0]["sku_id"], "lamp");
    assert_eq!(dup[0]["movement"], "RESERVE");
    assert_eq!(dup[0]["movement_ids"].as_array().unwrap().len(), 2);
    // The line's sums no longer fit its reservation either.
    let sums = found.of_kind("movement_mismatch");
    assert_eq!(ids(&sums, "order_id"), [doubled.as_str()]);

    let not_applied = found.of_kind("event_not_applied");
    assert!(!not_applied.is_empty(), "the forgotten event is reported");
    for v in &not_applied {
        assert_eq!(v["event_id"], forgotten.as_str());
        assert_eq!(v["consumer"], "wms");
        let (offset, committed) = (v["offset"].as_i64(), v["committed"].as_i64());
        assert!(
            offset.zip(committed).is_some_and(|(o, c)| o < c),
            "the forgotten event's offset is behind the committed one: {v}"
        );
    }

    let order = found.of_kind("order_violation");
    assert_eq!(ids(&order, "event_id"), [first.to_string()]);
    assert_eq!(order[0]["aggregate_id"], "probe-1");
    assert_eq!(order[0]["topic"], probe_topic.as_str());
    assert_eq!(order[0]["after_outbox_id"], 9_000_000_002_i64);

    let old = found.of_kind("stale_unpublished");
    assert_eq!(ids(&old, "event_id"), [stale.1]);
    assert_eq!(old[0]["database"], "stock");
    assert_eq!(old[0]["outbox_id"], stale.0);
    assert!(old[0]["age_s"].as_i64().unwrap() >= 7_000);

    let planted = [
        "missing_outbound",
        "duplicate_stock_movement",
        "movement_mismatch",
        "event_not_applied",
        "order_violation",
        "stale_unpublished",
    ];
    let others: Vec<Value> = found
        .violations()
        .into_iter()
        .filter(|v| !planted.contains(&v["kind"].as_str().unwrap_or_default()))
        .collect();
    assert!(others.is_empty(), "only the planted defects: {others:?}");
}

/// A slow link between the audit and the broker (the harness's proxy carries 200 kB/s from
/// the broker, the audit's request timeout is 10 s): the audit reads all six partitions back
/// from the beginning, every offset once. Each fetch answer has to arrive within the request
/// timeout, or librdkafka drops it and asks for the same offsets again, for ever; the audit
/// bounds its answers (`FETCH_MAX_BYTES`, 1 MiB: 5 s on this link), where librdkafka's
/// default would take the whole 3 MB in one answer (15 s on this link). A long chaos run's
/// audit never moved for this reason, on a broker that served records slowly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_reads_the_topics_back_over_a_slow_link() {
    use e2e::proxy::Proxy;
    use e2e::servers::Kafka;
    use outbox_audit::broker::Broker;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    const PARTITIONS: i32 = 6;
    const MESSAGES: usize = 3_000;
    const VALUE_BYTES: usize = 1_000;
    let proxy_port = e2e::free_port();
    let kafka = tokio::task::spawn_blocking(move || Kafka::start_behind(proxy_port))
        .await
        .unwrap();
    let proxy = Proxy::start(proxy_port, kafka.port).await;
    let brokers = format!("127.0.0.1:{proxy_port}");
    let topic = format!("slow-link-{:08x}", rand::random::<u32>());
    create_topics(&brokers, PARTITIONS, &[&topic]);

    let (b, t) = (brokers.clone(), topic.clone());
    tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("linger.ms", "20")
            .create()
            .unwrap();
        let value = "v".repeat(VALUE_BYTES);
        for n in 0..MESSAGES {
            let key = format!("k{n}");
            let record = BaseRecord::to(&t)
                .key(&key)
                .payload(&value)
                .partition(n as i32 % PARTITIONS);
            producer.send(record).map_err(|(e, _)| e).unwrap();
            producer.poll(Duration::ZERO);
        }
        producer.flush(Duration::from_secs(60)).unwrap();
    })
    .await
    .unwrap();

    proxy.limit_rate(200_000);
    let settings = [("socket.timeout.ms".to_owned(), "10000".to_owned())];
    let broker = Broker::new(&brokers, &settings, Duration::from_secs(120));
    let records = tokio::task::spawn_blocking(move || {
        let partitions = broker.partitions(&[topic]).unwrap();
        assert_eq!(partitions.values().sum::<i32>(), PARTITIONS);
        broker.read_all(&partitions)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("the audit did not read the topic back: {e}"));
    let mut offsets: Vec<(i32, i64)> = records.iter().map(|r| (r.partition, r.offset)).collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(records.len(), MESSAGES, "every message read once");
    assert_eq!(offsets.len(), MESSAGES, "no offset twice");
    for p in 0..PARTITIONS {
        let n = offsets.iter().filter(|(q, _)| *q == p).count();
        assert_eq!(
            n,
            MESSAGES / PARTITIONS as usize,
            "partition {p} read to its end"
        );
    }
}

/// A partition whose last transaction was aborted ends in records a `read_committed` reader
/// never sees and an abort marker: the audit reads it to its end all the same (its position
/// passes them), and returns the committed records only, where waiting for a record at the end
/// offset would time out on every run. Relays leave such partitions behind whenever a
/// transaction is aborted and its events go out in a later transaction to other offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_reads_a_partition_that_ends_in_an_aborted_transaction() {
    use outbox_audit::broker::Broker;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let brokers = e2e::kafka_brokers();
    let ended = format!("ends-aborted-{:08x}", rand::random::<u32>());
    let only = format!("only-aborted-{:08x}", rand::random::<u32>());
    create_topics(&brokers, 1, &[&ended, &only]);
    let (b, t1, t2) = (brokers.clone(), ended.clone(), only.clone());
    tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("transactional.id", format!("audit-aborted-{t1}"))
            .create()
            .unwrap();
        let timeout = Duration::from_secs(30);
        producer.init_transactions(timeout).unwrap();
        let send = |topic: &str, n: usize| {
            let key = format!("k{n}");
            producer
                .send(BaseRecord::to(topic).key(&key).payload("v").partition(0))
                .map_err(|(e, _)| e)
                .unwrap();
        };
        producer.begin_transaction().unwrap();
        send(&t1, 0);
        send(&t1, 1);
        producer.commit_transaction(timeout).unwrap();
        producer.begin_transaction().unwrap();
        send(&t1, 2);
        send(&t2, 3);
        producer.flush(timeout).unwrap();
        producer.abort_transaction(timeout).unwrap();
    })
    .await
    .unwrap();

    let broker = Broker::new(&brokers, &[], Duration::from_secs(20));
    let records = tokio::task::spawn_blocking(move || {
        let partitions = broker.partitions(&[ended, only]).unwrap();
        assert_eq!(partitions.len(), 2, "both topics: {partitions:?}");
        broker.read_all(&partitions)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("the audit did not read the partitions to their end: {e}"));
    let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [0, 1], "the committed records only: {records:?}");
}
