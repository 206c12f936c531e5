//! A consumer through a broker fault: a JoinGroup the group coordinator never answers (lost
//! on a connection that stays up) costs the consumer half a minute, not librdkafka's five. The
//! test starts a private broker behind the harness's proxy, which drops the request for real.

use std::time::Duration;

use e2e::servers::Kafka;

/// A group coordinator that never answers one JoinGroup (a request lost on a connection that
/// stays up: the consumer would go without partitions for as long as librdkafka waits). librdkafka gives up on a JoinGroup after `max.poll.interval.ms` + 3 s, drops the
/// connection and joins again; the runtime's 30 s default (librdkafka's own is 300 s) makes that
/// half a minute. The proxy in front of the broker drops the consumer's first JoinGroup for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_group_the_coordinator_never_answers_costs_a_consumer_half_a_minute() {
    let proxy_port = e2e::free_port();
    let kafka = tokio::task::spawn_blocking(move || Kafka::start_behind(proxy_port))
        .await
        .unwrap();
    let proxy = e2e::proxy::Proxy::start_kafka(proxy_port, kafka.port).await;
    proxy.swallow(e2e::proxy::JOIN_GROUP, 1);
    let brokers = format!("127.0.0.1:{proxy_port}");
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    let stock = e2e::fulfilment::Service::spawn(
        "stock-consumer",
        "stock-consumer",
        e2e::fulfilment::consumer_env(&db, &brokers, &prefix, "stock"),
    );
    e2e::wait_for(
        "the proxy to swallow the consumer's JoinGroup",
        Duration::from_secs(60),
        || async { (proxy.swallowed() == 1).then_some(()) },
    )
    .await;
    let swallowed_at = std::time::Instant::now();
    // With librdkafka's default the consumer would wait 303 s for the lost answer.
    stock.wait_ready(Duration::from_secs(120)).await;
    eprintln!(
        "stock consumer assigned {:.1} s after its JoinGroup was swallowed",
        swallowed_at.elapsed().as_secs_f64()
    );
    assert_eq!(proxy.swallowed(), 1, "the second JoinGroup went through");
}
