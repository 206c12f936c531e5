//! Guarantee 1 through outages: the broker stopped for 20 s, PostgreSQL restarted; the relay
//! retries with backoff and resumes by itself, and nothing committed is lost. A broker that
//! takes connections and never answers does not keep SIGTERM from stopping the relay at once.
//! Connections the server ends are replaced.
//! These tests start private servers because they stop them.

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use e2e::servers::{Kafka, PgCluster};
use e2e::stream::{write_stream, StreamSpec};

use crate::common::{assert_stays_up, drain_and_check, published, wait_published, AGGREGATE_TYPE};

/// The relay's `outbox_kafka_brokers_down` gauge.
async fn brokers_down(relay: &RelayProcess) -> Option<f64> {
    let text = relay.metrics().await?;
    e2e::proc::metric_value(&text, "outbox_kafka_brokers_down")
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_stopped_for_20s_then_restarted_loses_nothing() {
    let mut kafka = Kafka::start();
    let brokers = kafka.brokers();
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    let mut relay =
        RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "broker-outage"));

    // A small stream: the checking client reads it all back.
    let spec = StreamSpec {
        events: 3_000,
        pause: Duration::from_millis(80),
        ..StreamSpec::default()
    };
    let first_writers = spec.writers;
    let pool = db.pool.clone();
    let writers = tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &spec).await });

    wait_published(&relay, 300.0).await;
    assert_eq!(brokers_down(&relay).await, Some(0.0), "the broker is up");
    // A hot standby (started once `relay` leads): its idle producer also loses its connection
    // but sends nothing, so it never sees the recovery; only the leader reports broker state.
    let standby = RelayProcess::start(&RelayArgs::new(
        &db.url,
        &brokers,
        &prefix,
        "broker-outage-standby",
    ));
    e2e::wait_for("the standby's metrics", Duration::from_secs(30), || async {
        brokers_down(&standby).await.map(|_| ())
    })
    .await;
    // SIGKILL: a crash of the JVM.
    kafka.stop();
    let during = published(&relay).await;
    // What an operator sees first: the relay reports the broker unreachable.
    e2e::wait_for(
        "outbox_kafka_brokers_down to report the outage",
        Duration::from_secs(30),
        || async { (brokers_down(&relay).await == Some(1.0)).then_some(()) },
    )
    .await;
    // The outage itself: 20 s without a broker while writers commit more events (a stream of
    // its own: the first one may well have been written and published by now); the relay must
    // stay up throughout.
    let outage_spec = StreamSpec {
        events: 600,
        pause: Duration::from_millis(50),
        first_writer: first_writers,
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let outage_writers =
        tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &outage_spec).await });
    assert_stays_up(&mut relay, Duration::from_secs(20), "a broker outage").await;
    let mut written = writers.await.unwrap();
    let during_outage = outage_writers.await.unwrap();
    assert!(
        !during_outage.committed.is_empty(),
        "writers committed during the outage"
    );
    written.merge(during_outage);
    assert!(
        e2e::db::backlog(&db.pool).await.unwrap() > 0,
        "events committed during the outage wait in the outbox"
    );
    let after = published(&relay).await;
    assert!(
        after - during < 2_000.0,
        "nothing can be acknowledged without a broker"
    );
    kafka.start_again();

    let report = drain_and_check(
        &db.pool,
        &brokers,
        &prefix,
        &written,
        Duration::from_secs(240),
    )
    .await;
    eprintln!("broker outage: {} duplicates", report.duplicates);
    assert_eq!(
        brokers_down(&relay).await,
        Some(0.0),
        "deliveries after the restart clear the outage gauge"
    );
    assert_eq!(
        brokers_down(&standby).await,
        Some(0.0),
        "a standby reports no broker state"
    );
    let log = relay.log_text();
    let unreachable = count(&log, "Kafka broker unreachable");
    eprintln!("relay logged the broker outage {unreachable} time(s)");
    assert!(
        unreachable <= 3,
        "the outage should be logged once, not per retry:\n{log}"
    );
    let loud: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        loud.len() <= 6,
        "a broker outage should not flood the log with warnings:\n{}",
        loud.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_mid_stream_loses_nothing() {
    let pg = PgCluster::start();
    let db = e2e::db::fresh_database_on(&pg.url()).await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let mut relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "pg-restart"));

    let spec = StreamSpec {
        events: 4_000,
        pause: Duration::from_millis(40),
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let writers = tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &spec).await });

    wait_published(&relay, 300.0).await;
    // A writer transaction open at the moment of the crash, so the restart surely hits one
    // (the stream's writers may all be between transactions then, and wait out the outage).
    let mut in_flight = db.pool.begin().await.unwrap();
    outbox_writer::enqueue(
        &mut *in_flight,
        &outbox_writer::NewEvent::new(
            AGGREGATE_TYPE,
            "crashed",
            "StreamEvent",
            &serde_json::json!({}),
        ),
    )
    .await
    .unwrap();
    pg.stop_immediate();
    assert!(
        in_flight.commit().await.is_err(),
        "a transaction open across the crash cannot commit"
    );
    // 5 s without a database; the relay must stay up throughout.
    assert_stays_up(&mut relay, Duration::from_secs(5), "a database outage").await;
    pg.start_again();

    let written = writers.await.unwrap();
    let report = drain_and_check(
        &db.pool,
        &brokers,
        &prefix,
        &written,
        Duration::from_secs(180),
    )
    .await;
    eprintln!(
        "postgres restart: {} duplicates, {} writer transactions failed, {} events with unknown commit outcome",
        report.duplicates,
        written.failed_txns,
        written.unknown.len()
    );
    let log = relay.log_text();
    let failures = count(&log, "Operation failed; retrying with backoff");
    assert!(
        failures <= 10,
        "each outage should be logged once per component, got {failures}:\n{log}"
    );
    assert!(
        log.contains("Recovered"),
        "the relay should log its recovery:\n{log}"
    );
}

/// The server ends every connection of the relay's database (`pg_terminate_backend`, as an
/// administrator or a failover of a managed database does), once while the relay idles and
/// once mid-stream: each bucket's claims and marks keep their connection between them, and a
/// kept connection that died is replaced (tested before use after a second idle, or failing
/// one statement that is retried); the relay stays up and every committed event is published,
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_ended_by_the_server_are_replaced_and_nothing_is_lost() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let mut relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "ended"));
    let end_all = || async {
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        ended
    };
    let first = StreamSpec {
        events: 200,
        ..StreamSpec::default()
    };
    let mut written = write_stream(&db.pool, AGGREGATE_TYPE, &first).await;
    wait_published(&relay, written.committed.len() as f64).await;
    // Idle: every connection of the relay sits between two statements (the outbox is empty).
    e2e::wait_for(
        "the relay's connections to idle",
        Duration::from_secs(30),
        || async {
            let busy: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state <> 'idle'",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap();
            let backlog = e2e::db::backlog(&db.pool).await.unwrap();
            (busy == 0 && backlog == 0).then_some(())
        },
    )
    .await;
    // The test's own pool loses its other connections too: it opens new ones.
    assert!(end_all().await > 0, "the relay's connections were ended");
    let second = StreamSpec {
        events: 2_000,
        pause: Duration::from_millis(10),
        first_writer: first.writers,
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let writers = tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &second).await });
    wait_published(&relay, written.committed.len() as f64 + 100.0).await;
    end_all().await;
    assert_stays_up(
        &mut relay,
        Duration::from_secs(1),
        "connections ended by the server",
    )
    .await;
    written.merge(writers.await.unwrap());
    let report = drain_and_check(
        &db.pool,
        &brokers,
        &prefix,
        &written,
        Duration::from_secs(120),
    )
    .await;
    eprintln!(
        "connections ended: {} events, {} duplicates",
        written.committed.len(),
        report.duplicates
    );
}

/// A TCP listener that takes connections and never answers: a broker address behind a
/// firewall that drops replies, or a broker hung in the middle of a request. It reads the
/// client id of each connection's first Kafka request (the relay's producers say
/// `outbox-relay` and `outbox-relay-lone`, the connection check `outbox-check`).
struct BlackHole {
    clients: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    async fn bind(port: u16) -> Self {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the black hole");
        let clients = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = clients.clone();
        let task = tokio::spawn(async move {
            let mut held = tokio::task::JoinSet::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = seen.clone();
                held.spawn(async move {
                    // Request header: size (4), api key (2), version (2), correlation id (4),
                    // client id (2-byte length, then the bytes).
                    let mut head = [0u8; 14];
                    if socket.read_exact(&mut head).await.is_ok() {
                        let len = usize::from(u16::from_be_bytes([head[12], head[13]]));
                        let mut id = vec![0u8; len];
                        if socket.read_exact(&mut id).await.is_ok() {
                            seen.lock()
                                .unwrap()
                                .push(String::from_utf8_lossy(&id).into_owned());
                        }
                    }
                    // Never answer; hold the connection until the peer gives up.
                    let mut rest = [0u8; 1024];
                    while matches!(socket.read(&mut rest).await, Ok(n) if n > 0) {}
                });
            }
        });
        Self { clients, task }
    }

    /// Whether a connection check (a client that is not the relay's producer) is waiting.
    fn checking(&self) -> bool {
        self.clients
            .lock()
            .unwrap()
            .iter()
            .any(|c| c != "outbox-relay")
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `check` of `relay` waits on `hole`, then SIGTERMs the relay: it must exit 0 at
/// once, not after the check.
async fn stops_at_once_while_checking(relay: &mut RelayProcess, hole: &BlackHole, check: &str) {
    e2e::wait_for(
        &format!("{check} to wait on the silent broker"),
        Duration::from_secs(30),
        || async { hole.checking().then_some(()) },
    )
    .await;
    let (took, status) = relay
        .terminate(Duration::from_secs(25))
        .unwrap_or_else(|| panic!("SIGTERM during {check} stops the relay"));
    assert!(
        status.success(),
        "exit status {status}:\n{}",
        relay.log_text()
    );
    assert!(
        took < Duration::from_secs(5),
        "stopped only after {took:?}: it waited for {check}"
    );
}

/// SIGTERM stops a relay at once while its Kafka connection check waits on a broker that
/// never answers (librdkafka gives such a connection 10 s to answer, the check 30 s in all):
/// during the start-up check, and during the check that goes on in the background when no
/// broker answered at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_a_relay_whose_kafka_check_hangs_on_a_silent_broker() {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    // At start-up: the broker's address takes the connection and never answers.
    let port = e2e::free_port();
    let hole = BlackHole::bind(port).await;
    let brokers = format!("127.0.0.1:{port}");
    let mut relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "hung-check"));
    stops_at_once_while_checking(&mut relay, &hole, "the start-up check").await;
    drop(hole);

    // Nothing listens at start-up (refused at once: the relay carries on), then the address
    // goes silent: the check that goes on in the background hangs on it.
    let port = e2e::free_port();
    let brokers = format!("127.0.0.1:{port}");
    let mut relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "hung-later"));
    e2e::wait_for(
        "the relay to carry on past the start-up check",
        Duration::from_secs(30),
        || {
            let carried_on = relay
                .log_text()
                .contains("Kafka not reachable at start-up; carrying on");
            async move { carried_on.then_some(()) }
        },
    )
    .await;
    let hole = BlackHole::bind(port).await;
    // The background check connects at its next attempt (1 s, 2 s, 4 s, ... apart), and then
    // waits for an answer.
    stops_at_once_while_checking(&mut relay, &hole, "the background check").await;
}
