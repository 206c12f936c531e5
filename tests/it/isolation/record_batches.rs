//! Record batches and the broker: a record batch the broker refuses asynchronously lets no
//! later event of its aggregate overtake it (guarantees 3 and 5), and a batch is bounded in
//! bytes as well as rows.

use std::time::Duration;

use e2e::proc::{metric_series, metric_value, RelayArgs, RelayProcess};
use serde_json::json;

use crate::common::{ops, Ledger};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_refused_by_the_broker_lets_no_later_event_of_its_aggregate_overtake_it() {
    refused_record_batch(&[]).await;
}

/// `--park-after 1` parks an event on its first failure, but the other events of a record batch
/// the broker refused are suspects, not culprits: they are sent alone first, and only the
/// culprit parks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_park_after_1_only_the_culprit_of_a_refused_batch_parks() {
    refused_record_batch(&["--park-after", "1"]).await;
}

/// 3 000 events of 60 aggregates, one of them too large for the topic's `max.message.bytes`,
/// through a relay with `extra` arguments: everything but the poisoned aggregate drains, in
/// order, and only the poison is parked.
async fn refused_record_batch(extra: &[&str]) {
    // A topic whose max.message.bytes a poison event's record batch exceeds: the broker refuses
    // the whole record batch (MESSAGE_TOO_LARGE) in the produce response — the asynchronous,
    // per-batch failure of a topic-level limit.
    // The topic is created first (the relay would, but this test wants the stream to flow at
    // once).
    let mut setup = crate::common::PoisonTopic::new().await;
    let (poison_agg, poison_id) = setup.put_with_poison(3_000, 60, 1_505).await;
    let crate::common::PoisonTopic {
        prefix,
        topic,
        brokers,
        db,
        ledger,
    } = setup;
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "refused");
    args.extra = ["--batch-size", "1000"]
        .iter()
        .chain(extra)
        .map(|s| (*s).to_owned())
        .collect();
    let relay = RelayProcess::start(&args);

    // Every event of a refused record batch (hundreds here) is then retried alone, each in a
    // transaction of its own, at most 16 a batch: seconds on an idle machine, far longer on
    // one busy starting other tests' brokers. The deadline only catches a relay that hangs.
    crate::common::wait_drained_but(&db.pool, (&poison_agg, poison_id), Duration::from_secs(300))
        .await;
    let (on_broker, held) =
        crate::common::check_all_but_the_outbox(&db.pool, &brokers, &topic, &ledger).await;
    let (_, blocked) = ops(&["blocked"], &db.url);
    let events = blocked["events"].as_array().unwrap();
    assert_eq!(
        events.len(),
        1,
        "only the refused event is parked: {blocked}"
    );
    assert_eq!(events[0]["error_class"], "broker_rejected", "{blocked}");
    assert_eq!(events[0]["state"], "parked");
    // Parked on its first refusal while sent alone: at once if its aggregate was already being
    // retried alone (an earlier event of it shared a refused batch), else on the second try.
    let attempts = events[0]["attempts"].as_i64().unwrap();
    assert!((1..=2).contains(&attempts), "{blocked}");

    // The refusal stopped the producer (gapless guarantee): the relay started a new session,
    // once per batch (not twice, as when the publish step and the reaction to the batch's
    // failures each replaced it).
    let log = relay.log_text();
    let batches: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("starting a new producer session"))
        .map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("batch="))
                .unwrap_or("batch=?")
        })
        .collect();
    let replaced = batches.len();
    assert!(replaced >= 1, "the refused batch's producer was replaced");
    let distinct: std::collections::BTreeSet<&&str> = batches.iter().collect();
    assert_eq!(
        distinct.len(),
        replaced,
        "one new producer session per batch at most: {batches:?}"
    );
    eprintln!(
        "broker refusal: {on_broker} messages on the broker, {held} held, producer sessions replaced {replaced} times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_are_bounded_in_bytes_as_well_as_rows() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let mut ledger = Ledger::default();
    // 24 events of ~400 kB (compressible: stored far smaller than they are rendered).
    for i in 0..24 {
        let payload = json!({"n": i, "blob": "y".repeat(400_000)}).to_string();
        ledger
            .put(&db.pool, &format!("b-{}", i % 4), &payload, "{}", None)
            .await;
    }
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "bytes");
    args.extra = ["--batch-max-bytes", "1000000"].map(String::from).to_vec();
    let relay = RelayProcess::start(&args);
    e2e::wait_for("the outbox to drain", Duration::from_secs(60), || async {
        (e2e::db::backlog(&db.pool).await.ok()? == 0).then_some(())
    })
    .await;
    let metrics = relay.metrics().await.unwrap();
    let batches = metric_value(&metrics, "outbox_batch_rows_count").unwrap();
    let rows = metric_value(&metrics, "outbox_batch_rows_sum").unwrap();
    let within_10 = metric_series(&metrics, "outbox_batch_rows_bucket{le=\"10\"}").unwrap();
    eprintln!("24 events of 400 kB under a 1 MB bound: {batches} batches, {rows} rows");
    assert_eq!(rows, 24.0);
    assert!(
        batches >= 8.0,
        "at most 3 rows (1.2 MB) per batch: {batches} batches"
    );
    assert_eq!(within_10, batches, "no batch above 10 rows");
    let records = {
        let t = format!("{prefix}order");
        tokio::task::spawn_blocking(move || e2e::verify::dump(&brokers, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty() && missing.is_empty());
}
