//! A consumer through a broker fault: a JoinGroup the group coordinator never answers (lost
//! on a connection that stays up) costs the consumer half a minute, not librdkafka's five. The
//! test starts a private broker behind the harness's proxy, which drops the request for real.

use std::time::Duration;

use e2e::fulfilment::Service;
use e2e::servers::{Kafka, PgCluster};

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

/// The shutdown timeout the consumers of [`sigterm_stops_consumers_whose_broker_and_database_are_gone`]
/// run with (`CONSUMER_SHUTDOWN_TIMEOUT_MS` and, for the HTTP drain, `SHUTDOWN_TIMEOUT_MS`).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A WMS consumer, a stock consumer and an order service whose broker and database are both
/// gone (the broker SIGKILLed, PostgreSQL stopped `-m immediate`) stop on SIGTERM within their
/// shutdown timeout: closing the Kafka consumer (group leave, final commit) cannot complete
/// without a broker, so it is bounded; each exits non-zero, naming the cause in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_consumers_whose_broker_and_database_are_gone() {
    let mut kafka = tokio::task::spawn_blocking(Kafka::start).await.unwrap();
    let pg = tokio::task::spawn_blocking(PgCluster::start).await.unwrap();
    let brokers = kafka.brokers();
    let prefix = e2e::unique_topic_prefix();
    let admin = pg.url();
    let (order_db, wms_db, stock_db) = tokio::join!(
        e2e::db::fresh_database_on(&admin),
        e2e::db::fresh_database_on(&admin),
        e2e::db::fresh_database_on(&admin)
    );
    let timeout_ms = SHUTDOWN_TIMEOUT.as_millis().to_string();
    let env = |db: &e2e::db::TestDb, group: &str| {
        let mut env = e2e::fulfilment::consumer_env(db, &brokers, &prefix, group);
        env.push(("CONSUMER_SHUTDOWN_TIMEOUT_MS".into(), timeout_ms.clone()));
        env.push(("SHUTDOWN_TIMEOUT_MS".into(), timeout_ms.clone()));
        // Offsets stored after the last commit are still to be committed when the broker goes;
        // the group coordinator waits 30 s for a member that went quiet (librdkafka's final
        // commit and close wait for it, without a limit of their own).
        env.push((
            "KAFKA_CONSUMER_CONFIG".into(),
            "session.timeout.ms=30000,auto.commit.interval.ms=600000".into(),
        ));
        env
    };
    let mut order_env = env(&order_db, "order");
    order_env.push((
        "PAYMENT_CALLBACK_SECRET".into(),
        e2e::fulfilment::SECRET.into(),
    ));
    let services = [
        Service::spawn("order-service", "order-service", order_env),
        Service::spawn("wms-consumer", "wms-consumer", env(&wms_db, "wms")),
        Service::spawn("stock-consumer", "stock-consumer", env(&stock_db, "stock")),
    ];
    let ready = Duration::from_secs(120);
    futures::future::join_all(services.iter().map(|s| s.wait_ready(ready))).await;
    // A message without headers on each consumed topic: each consumer dead-letters one and
    // stores its offset, which only the close would commit.
    for aggregate in ["order", "outbound"] {
        let (brokers, topic) = (brokers.clone(), format!("{prefix}{aggregate}"));
        tokio::task::spawn_blocking(move || {
            e2e::fulfilment::produce(&brokers, &topic, "k", "{}", &[], None)
        })
        .await
        .unwrap();
    }
    for s in &services {
        e2e::wait_for(
            &format!("{} to dead-letter the message without headers", s.name),
            Duration::from_secs(60),
            || async {
                let m = s.metrics().await;
                let reason = [("reason", "missing_header")];
                (e2e::fulfilment::metric(&m, "consumer_dead_letters_total", &reason) >= 1.0)
                    .then_some(())
            },
        )
        .await;
    }

    kafka.stop();
    pg.stop_immediate();
    // Every consumer has noticed the broker is gone before it is told to stop.
    for s in &services {
        e2e::wait_for(
            &format!("{} to report the broker unreachable", s.name),
            Duration::from_secs(120),
            || async {
                s.log_text()
                    .contains("Kafka broker unreachable")
                    .then_some(())
            },
        )
        .await;
    }

    // The close is bounded by the shutdown timeout (at least 1 s of it); the rest of the margin
    // is for stopping the HTTP server and the process on a busy machine.
    let margin = Duration::from_secs(5);
    // SIGTERM to all three at once, each waited for on its own thread.
    let stops: Vec<_> = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let waits: Vec<_> = services
                .iter()
                .map(|s| scope.spawn(move || (s, s.terminate(SHUTDOWN_TIMEOUT + margin))))
                .collect();
            waits.into_iter().map(|w| w.join().unwrap()).collect()
        })
    });
    let mut failures = vec![];
    for (s, ended) in stops {
        let log = s.log_text();
        match ended {
            None => failures.push(format!(
                "{} did not exit within {:?} of SIGTERM (killed); log {}:\n{}",
                s.name,
                SHUTDOWN_TIMEOUT + margin,
                s.log.display(),
                tail(&log, 15)
            )),
            Some((took, status)) => {
                eprintln!("{}: exited {status} {took:?} after SIGTERM", s.name);
                if status.success() {
                    failures.push(format!(
                        "{} exited 0 without its broker; expected a failure naming the cause",
                        s.name
                    ));
                }
                if !log.contains("Kafka consumer did not close") {
                    failures.push(format!(
                        "{}'s log does not name the unfinished close:\n{}",
                        s.name,
                        tail(&log, 15)
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
