//! `outbox-relay`: parse configuration, run the chosen subcommand.

use anyhow::Context;
use clap::Parser;
use outbox_relay::config::{Cli, Command, OpsArgs, RunArgs};
use outbox_relay::metrics::Metrics;
use outbox_relay::ops;
use outbox_relay::parking::{ParkPolicy, RedriveTarget};
use outbox_relay::status::Status;
use outbox_relay::{Relay, RelaySettings, Store};

/// jemalloc for the whole process: with `unprefixed_malloc_on_supported_platforms` it also
/// serves librdkafka's `malloc`/`free`, which allocates and frees per message. glibc's malloc
/// spent about a fifth of the relay's CPU in `malloc_consolidate`, `_int_free` and friends while
/// draining (perf, `relay-bench --phases drain`); docs/src/benchmarks.md has the figures.
#[cfg(all(target_os = "linux", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One thread for the relay's own work: a batch is claimed, published and marked in sequence,
/// and librdkafka has its threads. Against the multi-threaded runtime it saved 0.15-0.5 µs of
/// relay CPU per drained event (three interleaved pairs of `relay-bench --phases produce,drain`),
/// fewer wake-ups across threads.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    outbox_process::init_logging();
    match Cli::parse().command {
        Command::Migrate(db) => {
            let store = Store::connect_lazy_with(&db.database_url, db.pgbouncer)
                .context("invalid DATABASE_URL")?;
            outbox_writer::schema::migrate(store.pool())
                .await
                .context("applying the outbox schema")?;
            if let Some(problem) = outbox_writer::schema::id_sequence_problem(store.pool())
                .await
                .context("checking the outbox's id sequence")?
            {
                anyhow::bail!(problem);
            }
            println!("outbox schema is up to date");
        }
        Command::Status(args) => {
            let store = Store::connect_lazy_with(&args.db.database_url, args.db.pgbouncer)
                .context("invalid DATABASE_URL")?;
            let status = Status::read(&store, &args.lease_name)
                .await
                .context("reading the outbox status")?;
            if args.json {
                println!("{}", serde_json::to_string(&status)?);
            } else {
                print!("{}", status.to_text());
            }
        }
        Command::Blocked(args) => {
            let store = ops_store(&args)?;
            exit_with(
                ops::blocked(&store, args.json)
                    .await
                    .context("listing blocked events")?,
            );
        }
        Command::Redrive(args) => {
            let store = ops_store(&args.ops)?;
            let target = match (args.event_id, args.aggregate, args.all) {
                (Some(id), _, _) => RedriveTarget::Event(id),
                (_, Some((aggregate_type, aggregate_id)), _) => RedriveTarget::Aggregate {
                    aggregate_type,
                    aggregate_id,
                },
                _ => RedriveTarget::All,
            };
            exit_with(
                ops::redrive(&store, &target, args.ops.json)
                    .await
                    .context("redriving events")?,
            );
        }
        Command::Discard(args) => {
            let store = ops_store(&args.ops)?;
            let by = args
                .by
                .clone()
                .filter(|b| !b.trim().is_empty())
                .unwrap_or_else(|| "unknown".to_owned());
            exit_with(
                ops::discard(&store, args.event_id, &args.reason, &by, args.ops.json)
                    .await
                    .context("discarding the event")?,
            );
        }
        Command::Run(args) => run(*args).await?,
        Command::DebeziumInstall(args) => outbox_relay::debezium::install(&args).await?,
        Command::Buckets(args) => {
            let store = Store::connect_lazy_with(&args.db.database_url, args.db.pgbouncer)
                .context("invalid DATABASE_URL")?;
            exit_with(
                outbox_relay::ops::buckets(&store, &args.lease_name, args.set, args.json).await?,
            );
        }
    }
    Ok(())
}

fn ops_store(args: &OpsArgs) -> anyhow::Result<Store> {
    Store::connect_lazy_with(&args.db.database_url, args.db.pgbouncer)
        .context("invalid DATABASE_URL")
}

fn exit_with(report: ops::Report) {
    print!("{}", report.output);
    if !report.output.ends_with('\n') {
        println!();
    }
    if report.code != 0 {
        std::process::exit(report.code);
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let user_kafka_config = args.kafka.kafka_config();
    outbox_relay::publisher::check_overrides(&user_kafka_config).map_err(|e| anyhow::anyhow!(e))?;
    let kafka_config = args
        .kafka
        .security
        .settings(&user_kafka_config)
        .context("Kafka security settings")?;
    args.secrets.check(&[
        outbox_process::secrets::Secret::database_url(
            "DATABASE_URL (--database-url)",
            &args.db.database_url,
        ),
        kafka_config.password_secret(),
    ])?;
    if let (Some(rf), Some(n)) = (
        args.kafka.topic_replication_factor,
        args.kafka.topic_min_insync_replicas,
    ) {
        anyhow::ensure!(
            n <= rf,
            "--topic-min-insync-replicas {n} is above --topic-replication-factor {rf}: the created topics would refuse every write"
        );
    }
    let store = Store::connect_lazy_with(&args.db.database_url, args.db.pgbouncer)
        .context("invalid DATABASE_URL")?;
    // PRODUCER spans over OTLP when the standard OTEL_* variables ask for them; off, nothing.
    let _telemetry = outbox_trace::otlp::init_or_run_without("outbox-relay");
    let settings = RelaySettings {
        brokers: args.kafka.kafka_brokers.clone(),
        kafka_config,
        topic_prefix: args.kafka.topic_prefix.clone(),
        wire: args.kafka.wire(),
        create_topics: args.kafka.create_missing_topics.then_some(
            outbox_relay::topics::TopicSpec {
                partitions: args.kafka.topic_partitions,
                replication: args.kafka.topic_replication_factor,
                min_insync_replicas: args.kafka.topic_min_insync_replicas,
            },
        ),
        limits: args.claim_limits(),
        park: ParkPolicy {
            park_after: args.park_after,
            ..ParkPolicy::default()
        },
        poll: args.poll_bounds(),
        min_batch_interval: args.min_batch_interval(),
        lease_name: args.lease_name.clone(),
        instance_id: args.instance_id(),
        lease_ttl: args.lease_ttl(),
        shutdown_timeout: args.shutdown_timeout(),
        send_timeout: args.send_timeout(),
        transactional_id: args.transactional_id().context("--transactional-id")?,
        records_topic: args.records_topic.clone().unwrap_or_else(|| {
            format!(
                "{}{}",
                args.kafka.topic_prefix,
                outbox_relay::records::DEFAULT_TOPIC
            )
        }),
        discarded_retention: args.discarded_retention(),
        purge: args.purge.settings(),
    };
    let metrics = Metrics::new();
    let shutdown = outbox_process::shutdown_on_signal();
    let server = tokio::spawn(outbox_relay::metrics::serve(
        args.metrics_addr,
        metrics.clone(),
        shutdown.clone(),
    ));
    // A refused login or certificate is retried by librdkafka forever, like an outage: stop
    // here instead, naming the cause, before anything is claimed or published; and, when no
    // broker answered yet, the first time one does.
    let refusal = match outbox_kafka::probe::check_at_start(
        &args.kafka.kafka_brokers,
        &settings.kafka_config,
        outbox_kafka::probe::START_CHECK_TIMEOUT,
        &shutdown,
    )
    .await
    {
        Ok(check) => check.stop_on_refusal(shutdown.clone()),
        Err(e) => {
            shutdown.cancel();
            let _ = server.await;
            return Err(anyhow::Error::new(e).context("connecting to Kafka"));
        }
    };
    let relay = Relay::new(store, settings, metrics);
    let result = relay.run(shutdown.clone()).await;
    shutdown.cancel();
    match server.await {
        Ok(Err(e)) => tracing::error!(error = %e, "Metrics server failed"),
        Err(e) => tracing::error!(error = %e, "Metrics server panicked"),
        Ok(Ok(())) => {}
    }
    refusal.check().context("connecting to Kafka")?;
    result
}
