//! The relay behind PgBouncer's transaction pooling (`--pgbouncer`): two relays and eight
//! concurrent writers share four server connections through a real PgBouncer; every committed event
//! is delivered in order (guarantee 3), the standby takes over after a SIGKILL of the leader, and
//! no relay logs a database error.

use std::str::FromStr;
use std::time::{Duration, Instant};

use e2e::pgbouncer::PgBouncer;
use e2e::proc::{metric_value, RelayArgs, RelayProcess};
use e2e::stream::{write_stream, StreamSpec};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::common::{drain_and_check, lease_holder, published, wait_published, AGGREGATE_TYPE};

/// Server connections PgBouncer keeps per database: far fewer than its clients (two relays
/// with up to four connections each, eight writers), so server connections change hands
/// between every transaction.
const SERVER_CONNECTIONS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_and_writers_through_pgbouncer_deliver_in_order_and_fail_over() {
    let admin = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let db = e2e::db::fresh_database().await;
    let bouncer = PgBouncer::start(&admin, SERVER_CONNECTIONS).await;
    let via_bouncer = bouncer.url_for(&db.url);
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();

    // Writers through PgBouncer too: no statement cache, no extra_float_digits (PgBouncer's
    // `server_reset_query_always` drops what their transactions prepared).
    let options = PgConnectOptions::from_str(&via_bouncer)
        .unwrap()
        .statement_cache_capacity(0)
        .extra_float_digits(None);
    let writer_pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("connect through pgbouncer");
    let spec = StreamSpec {
        events: 6_000,
        pause: Duration::from_millis(40),
        ..StreamSpec::default()
    };
    let writers =
        tokio::spawn(async move { write_stream(&writer_pool, AGGREGATE_TYPE, &spec).await });

    let relay = |name: &str| {
        let mut args = RelayArgs::new(&via_bouncer, &brokers, &prefix, name);
        args.extra = vec!["--pgbouncer".into()];
        RelayProcess::start(&args)
    };
    let mut relays = [relay("bouncer-relay-a"), relay("bouncer-relay-b")];
    let (holder, epoch) =
        e2e::wait_for("a relay to take the lease", Duration::from_secs(30), || {
            lease_holder(&db.pool)
        })
        .await;
    let leader = usize::from(holder != "bouncer-relay-a");
    let standby = 1 - leader;
    wait_published(&relays[leader], 500.0).await;
    assert_eq!(
        published(&relays[standby]).await,
        0.0,
        "the standby must not publish"
    );
    let leader_log = relays[leader].log_text();

    relays[leader].kill();
    let killed_at = Instant::now();
    let standby_name = if standby == 0 {
        "bouncer-relay-a"
    } else {
        "bouncer-relay-b"
    };
    let (_, new_epoch) = e2e::wait_for(
        "the standby to take over through pgbouncer",
        Duration::from_secs(10),
        || async {
            lease_holder(&db.pool)
                .await
                .filter(|(h, _)| h == standby_name)
        },
    )
    .await;
    eprintln!(
        "pgbouncer: standby took over {:?} after the SIGKILL (epoch {epoch} -> {new_epoch})",
        killed_at.elapsed()
    );
    assert!(new_epoch > epoch);

    let written = writers.await.unwrap();
    assert_eq!(
        written.failed_txns, 0,
        "writer transactions failed through pgbouncer"
    );
    let report = drain_and_check(
        &db.pool,
        &brokers,
        &prefix,
        &written,
        Duration::from_secs(180),
    )
    .await;
    let survivor = &relays[standby];
    let metrics = survivor.metrics().await.expect("survivor metrics");
    assert_eq!(
        metric_value(&metrics, "outbox_relay_database_errors_total"),
        Some(0.0),
        "database errors through pgbouncer"
    );
    for (name, log) in [("leader", leader_log), ("standby", survivor.log_text())] {
        for bad in [
            " WARN ",
            " ERROR ",
            "prepared statement",
            "extra_float_digits",
            "database",
        ] {
            let hits: Vec<&str> = log
                .lines()
                // sqlx's "slow statement" warning says the machine was busy (a BEGIN over 1 s
                // when CI shares two cores), nothing about PgBouncer.
                .filter(|l| {
                    l.contains(bad) && !l.contains("librdkafka") && !l.contains("slow statement")
                })
                .collect();
            assert!(hits.is_empty(), "{name} relay logged {bad:?}: {hits:#?}");
        }
    }
    // The operator commands take the same flag.
    let status = e2e::proc::relay_cli(&[
        "status",
        "--database-url",
        &via_bouncer,
        "--pgbouncer",
        "--json",
    ]);
    assert!(
        status.status.success(),
        "status through pgbouncer: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["unpublished"], 0, "{status}");
    let bouncer_log = bouncer.log_text();
    assert!(
        !bouncer_log.contains("prepared statement"),
        "pgbouncer saw prepared-statement errors:\n{bouncer_log}"
    );
    eprintln!(
        "pgbouncer: {} committed events delivered in order through {SERVER_CONNECTIONS} server connections, {} duplicates",
        written.committed.len(),
        report.duplicates
    );
}
