//! `stock-consumer dlq list` and `dlq redrive` as processes against a running stock consumer:
//! an event the database refused is dead-lettered, listed, fixed, redriven and applied once; a
//! second redrive is an inbox duplicate; an unknown event id fails with a message. And two
//! consumer groups on one topic (runtimes in this process, the same `dlq` commands): a redrive
//! reaches only the consumer that dead-lettered the event.

use std::sync::Arc;
use std::time::Duration;

use e2e::fulfilment::{count, inbox_duplicates, produce};
use e2e::proc::{workspace_binary, ServiceProcess};
use outbox_consumer::dlq_cli::{self, ConsumerCommand, DlqCommand, RedriveArgs};
use outbox_consumer::{ConsumerMetrics, Effect, Event, Handler, HandlerError, RuntimeConfig};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::ClientConfig;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Runs `stock-consumer dlq <args>` with `envs`; returns (exit success, stdout, stderr).
async fn dlq(envs: &[(String, String)], args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(workspace_binary("stock-consumer"))
        .arg("dlq")
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .output()
        .await
        .expect("run stock-consumer dlq");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn listed(envs: &[(String, String)]) -> Vec<Value> {
    let (ok, stdout, stderr) = dlq(envs, &["list", "--json"]).await;
    assert!(ok, "dlq list failed: {stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(doc["consumer"], "stock");
    doc["dead_letters"].as_array().cloned().unwrap_or_default()
}

/// Starts `stock-consumer` on `db` (log `name`), topics under `prefix`, group
/// `<prefix>stock`, and waits until it has partitions; returns its environment (what its `dlq`
/// commands run with) and the process.
async fn start_stock_consumer(
    db: &e2e::db::TestDb,
    brokers: &str,
    prefix: &str,
    name: &str,
) -> (Vec<(String, String)>, ServiceProcess) {
    let envs: Vec<(String, String)> = [
        ("DATABASE_URL", db.url.as_str()),
        ("KAFKA_BROKERS", brokers),
        ("OUTBOX_TOPIC_PREFIX", prefix),
        ("KAFKA_GROUP_ID", &format!("{prefix}stock")),
        ("CONSUMER_CREATE_MISSING_TOPICS", "true"),
        ("CONSUMER_TOPIC_PARTITIONS", "3"),
        ("KAFKA_CONSUMER_CONFIG", "session.timeout.ms=6000"),
        ("CONSUMER_RETRY_MAX_BACKOFF_MS", "500"),
        ("LISTEN_ADDR", "127.0.0.1:0"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let env_refs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let consumer = ServiceProcess::start("stock-consumer", name, &[], &env_refs);
    e2e::wait_for(
        "the stock consumer to be assigned its partitions",
        Duration::from_secs(90),
        || async {
            consumer
                .log_text()
                .contains("Partitions assigned")
                .then_some(())
        },
    )
    .await;
    (envs, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixed_dead_letter_redriven_is_applied_exactly_once() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let (envs, consumer) = start_stock_consumer(&db, &brokers, &prefix, "stock-consumer-dlq").await;

    // The database refuses this order's reservation until an operator fixes it.
    let order = Uuid::new_v4();
    sqlx::query("INSERT INTO stock (sku_id, on_hand) VALUES ('R1', 10)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER TABLE reservations ADD CONSTRAINT e2e_blocked CHECK (order_id <> '{order}')"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let event_id = Uuid::new_v4();
    let paid = json!({"order_id": order, "items": [{"sku_id": "R1", "quantity": 1}]}).to_string();
    let headers: Vec<(String, String)> = [
        ("event_id", event_id.to_string()),
        ("event_type", "OrderPaid".to_owned()),
        ("aggregate_type", "order".to_owned()),
        ("aggregate_id", order.to_string()),
        ("traceparent", "00-e2e-01".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    tokio::task::spawn_blocking({
        let (brokers, topic, key) = (brokers.clone(), topic.clone(), order.to_string());
        move || produce(&brokers, &topic, &key, &paid, &headers, None)
    })
    .await
    .unwrap();

    let letter = e2e::wait_for(
        "dlq list to show the refused event",
        Duration::from_secs(60),
        || async {
            listed(&envs)
                .await
                .into_iter()
                .find(|l| l["event_id"] == event_id.to_string())
        },
    )
    .await;
    assert_eq!(letter["reason"], "unapplicable", "{letter}");
    assert_eq!(letter["source_topic"], topic.as_str(), "{letter}");
    assert_eq!(letter["event_type"], "OrderPaid", "{letter}");
    assert!(letter["source_offset"].is_i64(), "{letter}");
    assert!(letter["dead_lettered_at"].is_string(), "{letter}");
    assert!(
        letter["error"]
            .as_str()
            .unwrap_or_default()
            .contains("e2e_blocked"),
        "{letter}"
    );
    let reservations = || {
        count(
            &db.pool,
            "SELECT count(*) FROM reservations WHERE status = 'RESERVED'",
        )
    };
    assert_eq!(reservations().await, 0);

    // Fixed: the redrive applies it.
    sqlx::query("ALTER TABLE reservations DROP CONSTRAINT e2e_blocked")
        .execute(&db.pool)
        .await
        .unwrap();
    let id = event_id.to_string();
    let (ok, stdout, stderr) = dlq(&envs, &["redrive", "--event-id", &id, "--json"]).await;
    assert!(ok, "dlq redrive failed: {stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let redriven = doc["redriven"].as_array().cloned().unwrap_or_default();
    assert_eq!(redriven.len(), 1, "{doc}");
    assert_eq!(redriven[0]["event_id"], id.as_str());
    assert_eq!(
        redriven[0]["topic"],
        format!("{topic}.stock.redrive"),
        "to the stock consumer's own redrive topic"
    );
    e2e::wait_for(
        "the redriven event applied",
        Duration::from_secs(60),
        || async { (reservations().await == 1).then_some(()) },
    )
    .await;
    let reserved = || count(&db.pool, "SELECT reserved FROM stock WHERE sku_id = 'R1'");
    assert_eq!(reserved().await, 1);

    // Again: the inbox counts a duplicate, nothing is applied twice.
    let (ok, _, stderr) = dlq(&envs, &["redrive", "--event-id", &id]).await;
    assert!(ok, "second dlq redrive failed: {stderr}");
    e2e::wait_for(
        "the second redrive counted as an inbox duplicate",
        Duration::from_secs(60),
        || async { (inbox_duplicates(&db.pool).await == 1).then_some(()) },
    )
    .await;
    assert_eq!(reservations().await, 1, "applied exactly once");
    assert_eq!(reserved().await, 1);
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM stock_movements").await,
        1
    );
    assert_eq!(
        listed(&envs)
            .await
            .iter()
            .filter(|l| l["event_id"] == id.as_str())
            .count(),
        1,
        "redriving dead-lettered nothing new"
    );

    // An event id no dead letter has: non-zero exit, the message names it.
    let unknown = Uuid::new_v4().to_string();
    let (ok, stdout, stderr) = dlq(&envs, &["redrive", "--event-id", &unknown]).await;
    assert!(!ok, "redrive of an unknown event id must fail: {stdout}");
    assert!(
        stderr.contains(&format!(
            "no dead letter of consumer `stock` has event id {unknown}"
        )),
        "{stderr}"
    );
    drop(consumer);
}

/// Records each `Note` event in `effects` under its consumer's name; refuses it (dead-letters
/// it at once) while `flags` holds `block:<consumer>`.
struct Noter {
    name: &'static str,
}

impl Handler for Noter {
    fn versions(&self, event_type: &str) -> Option<&'static [u32]> {
        (event_type == "Note").then_some(&[1])
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let blocked: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM flags WHERE name = $1)")
                .bind(format!("block:{}", self.name))
                .fetch_one(&mut *conn)
                .await?;
        if blocked {
            return Err(HandlerError::Unapplicable(format!(
                "{} is blocked",
                self.name
            )));
        }
        sqlx::query("INSERT INTO effects (consumer, event_id) VALUES ($1, $2)")
            .bind(self.name)
            .bind(event.event_id())
            .execute(&mut *conn)
            .await?;
        Ok(Effect::Changed)
    }
}

/// One consumer group running in this process.
struct Group {
    config: RuntimeConfig,
    pool: PgPool,
    metrics: ConsumerMetrics,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), outbox_consumer::ConsumerError>>,
}

impl Group {
    /// Starts consumer `name` (group `<topic>-<name>`) on `topic` and waits until it has every
    /// partition of the topic and of its redrive topic.
    async fn start(name: &'static str, topic: &str, pool: &PgPool) -> Self {
        let config = crate::common::runtime_config(name, topic, 2, 16);
        let metrics = ConsumerMetrics::register(&prometheus::Registry::new(), name).unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(outbox_consumer::run(
            config.clone(),
            pool.clone(),
            Arc::new(Noter { name }),
            metrics.clone(),
            shutdown.clone(),
        ));
        e2e::wait_for(
            "the consumer to be assigned the topic's and its redrive topic's partitions",
            Duration::from_secs(60),
            || async { (metrics.assigned_partitions.get() == 4).then_some(()) },
        )
        .await;
        Self {
            config,
            pool: pool.clone(),
            metrics,
            shutdown,
            task,
        }
    }

    /// Runs a `dlq` command as the binaries do; returns its JSON output.
    async fn dlq(&self, command: DlqCommand) -> Value {
        let mut out = Vec::new();
        dlq_cli::run(
            &ConsumerCommand::Dlq(command),
            &self.config,
            &self.pool,
            &mut out,
        )
        .await
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    fn finished(&self) -> u64 {
        [
            "applied",
            "unchanged",
            "duplicate",
            "ignored",
            "dead_lettered",
        ]
        .iter()
        .map(|o| self.metrics.messages.with_label_values(&[o]).get())
        .sum()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the runtime stops within 30 s")
            .unwrap()
            .unwrap();
    }
}

/// Produces a `Note` event with key `key` to `topic`; returns its id.
async fn note(producer: &FutureProducer, topic: &str, key: &str) -> Uuid {
    let id = Uuid::new_v4();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_type",
            value: Some("Note"),
        })
        .insert(Header {
            key: "event_id",
            value: Some(&id.to_string()),
        });
    let record = FutureRecord::to(topic)
        .key(key)
        .payload("{}")
        .headers(headers);
    producer
        .send(record, Timeout::After(Duration::from_secs(30)))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redriven_dead_letter_reaches_only_the_consumer_group_that_dead_lettered_it() {
    let db = e2e::db::fresh_database().await;
    outbox_writer::schema::migrate_inbox(&db.pool)
        .await
        .unwrap();
    for ddl in [
        "CREATE TABLE effects (consumer text NOT NULL, event_id uuid NOT NULL)",
        "CREATE TABLE flags (name text PRIMARY KEY)",
        "INSERT INTO flags (name) VALUES ('block:alpha')",
    ] {
        sqlx::query(ddl).execute(&db.pool).await.unwrap();
    }
    let topic = format!("{}note", e2e::unique_topic_prefix());
    let alpha = Group::start("alpha", &topic, &db.pool).await;
    let beta = Group::start("beta", &topic, &db.pool).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", e2e::kafka_brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .set("enable.metrics.push", "false")
        .create()
        .unwrap();
    let effects = |consumer: &'static str, id: Uuid| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM effects WHERE consumer = $1 AND event_id = $2",
            )
            .bind(consumer)
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let inbox = |consumer: &'static str, id: Uuid| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>(
                "SELECT duplicates FROM inbox WHERE consumer_name = $1 AND event_id = $2",
            )
            .bind(consumer)
            .bind(id)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };

    let event = note(&producer, &topic, "k").await;
    e2e::wait_for(
        "beta to apply the event and alpha to dead-letter it",
        Duration::from_secs(60),
        || async {
            (effects("beta", event).await == 1
                && alpha
                    .metrics
                    .messages
                    .with_label_values(&["dead_lettered"])
                    .get()
                    == 1)
                .then_some(())
        },
    )
    .await;
    assert_eq!(effects("alpha", event).await, 0);
    let listed = alpha.dlq(DlqCommand::List { json: true }).await;
    let letters = listed["dead_letters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(letters.len(), 1, "{listed}");
    assert_eq!(letters[0]["event_id"], event.to_string());
    assert_eq!(letters[0]["source_topic"], topic.as_str());
    let alpha_redrive = format!("{topic}.alpha.redrive");
    assert_eq!(letters[0]["redrive_topic"], alpha_redrive.as_str());
    let beta_listed = beta.dlq(DlqCommand::List { json: true }).await;
    assert_eq!(
        beta_listed["dead_letters"],
        json!([]),
        "beta's letters only"
    );

    // Fixed, redriven: alpha applies it.
    sqlx::query("DELETE FROM flags")
        .execute(&db.pool)
        .await
        .unwrap();
    let beta_finished = beta.finished();
    let redriven = alpha
        .dlq(DlqCommand::Redrive(RedriveArgs {
            event_id: Some(event),
            all: false,
            json: true,
        }))
        .await;
    assert_eq!(
        redriven["redriven"][0]["topic"],
        alpha_redrive.as_str(),
        "{redriven}"
    );
    e2e::wait_for(
        "alpha to apply the redriven event",
        Duration::from_secs(60),
        || async { (effects("alpha", event).await == 1).then_some(()) },
    )
    .await;
    // A later event of the same key, on the same partition: once beta applied it, beta has read
    // everything sent to the topic before it, a redrive to the shared topic included.
    let later = note(&producer, &topic, "k").await;
    e2e::wait_for(
        "both groups to apply the later event",
        Duration::from_secs(60),
        || async {
            (effects("alpha", later).await == 1 && effects("beta", later).await == 1).then_some(())
        },
    )
    .await;

    assert_eq!(effects("alpha", event).await, 1, "alpha applied it once");
    assert_eq!(inbox("alpha", event).await, Some(0), "alpha: one inbox row");
    assert_eq!(
        effects("beta", event).await,
        1,
        "beta applied it once, before"
    );
    assert_eq!(
        inbox("beta", event).await,
        Some(0),
        "beta never received the redriven event (not even as an inbox duplicate)"
    );
    assert_eq!(
        beta.finished() - beta_finished,
        1,
        "beta finished only the later event after the redrive"
    );
    assert_eq!(beta.metrics.inbox_duplicates.get(), 0);
    assert_eq!(alpha.metrics.inbox_duplicates.get(), 0);
    alpha.stop().await;
    beta.stop().await;
}

/// Produces an `OrderPaid` of a new order (one `R1`) that the stock consumer's database
/// refuses until `ALTER TABLE reservations DROP CONSTRAINT e2e_blocked`; returns its event id
/// once `dlq list` shows it dead-lettered.
async fn refused_order_paid(
    db: &e2e::db::TestDb,
    envs: &[(String, String)],
    brokers: &str,
    topic: &str,
) -> Uuid {
    let order = Uuid::new_v4();
    sqlx::query(&format!(
        "ALTER TABLE reservations ADD CONSTRAINT e2e_blocked CHECK (order_id <> '{order}')"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let event_id = Uuid::new_v4();
    let paid = json!({"order_id": order, "items": [{"sku_id": "R1", "quantity": 1}]}).to_string();
    let headers: Vec<(String, String)> = [
        ("event_id", event_id.to_string()),
        ("event_type", "OrderPaid".to_owned()),
        ("aggregate_type", "order".to_owned()),
        ("aggregate_id", order.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    tokio::task::spawn_blocking({
        let (brokers, topic, key) = (brokers.to_owned(), topic.to_owned(), order.to_string());
        move || produce(&brokers, &topic, &key, &paid, &headers, None)
    })
    .await
    .unwrap();
    e2e::wait_for(
        "dlq list to show the refused event",
        Duration::from_secs(60),
        || async {
            listed(envs)
                .await
                .iter()
                .any(|l| l["event_id"] == event_id.to_string())
                .then_some(())
        },
    )
    .await;
    sqlx::query("ALTER TABLE reservations DROP CONSTRAINT e2e_blocked")
        .execute(&db.pool)
        .await
        .unwrap();
    event_id
}

/// `dlq redrive --all --json`; returns the redriven letters (`event_id`, `topic`,
/// `partition`, `offset`).
async fn redrive_all(envs: &[(String, String)]) -> Vec<Value> {
    let (ok, stdout, stderr) = dlq(envs, &["redrive", "--all", "--json"]).await;
    assert!(ok, "dlq redrive --all failed: {stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    doc["redriven"].as_array().cloned().unwrap_or_default()
}

/// Waits until consumer group `group` committed past every message of `redriven`: the
/// consumer has finished them all.
async fn wait_consumed(brokers: &str, group: &str, redriven: &[Value]) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let consumer = std::sync::Arc::new(consumer);
    for r in redriven {
        let topic = r["topic"].as_str().unwrap().to_owned();
        let partition = i32::try_from(r["partition"].as_i64().unwrap()).unwrap();
        let offset = r["offset"].as_i64().unwrap();
        e2e::wait_for(
            &format!("group {group} to commit past {topic}/{partition}@{offset}"),
            Duration::from_secs(60),
            || {
                let (consumer, topic) = (consumer.clone(), topic.clone());
                async move {
                    tokio::task::spawn_blocking(move || {
                        let mut tpl = rdkafka::TopicPartitionList::new();
                        tpl.add_partition(&topic, partition);
                        let committed = consumer
                            .committed_offsets(tpl, Duration::from_secs(5))
                            .ok()?;
                        match committed.find_partition(&topic, partition)?.offset() {
                            rdkafka::Offset::Offset(o) if o > offset => Some(()),
                            _ => None,
                        }
                    })
                    .await
                    .unwrap()
                }
            },
        )
        .await;
    }
}

/// `dlq redrive --all` never sends a letter again that it redrove before, even once the
/// inbox row that made a second redrive a duplicate is gone (purged by retention, which keeps
/// days; the dead-letter topic keeps letters longer): an event is dead-lettered, fixed,
/// redriven and applied; its inbox row is deleted as retention would; another event is
/// dead-lettered and fixed; `--all` again sends only the new one, and the first is not applied
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redrive_all_never_applies_a_letter_again_after_its_inbox_row_aged_out() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let group = format!("{prefix}stock");
    let (envs, consumer) =
        start_stock_consumer(&db, &brokers, &prefix, "stock-consumer-redrive-all").await;
    sqlx::query("INSERT INTO stock (sku_id, on_hand) VALUES ('R1', 10)")
        .execute(&db.pool)
        .await
        .unwrap();
    let reserved = || count(&db.pool, "SELECT reserved FROM stock WHERE sku_id = 'R1'");

    // Dead-lettered, fixed, redriven, applied.
    let first = refused_order_paid(&db, &envs, &brokers, &topic).await;
    let sent = redrive_all(&envs).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["event_id"], first.to_string());
    wait_consumed(&brokers, &group, &sent).await;
    assert_eq!(reserved().await, 1);

    // Retention forgets the inbox row (the dead-letter topic keeps the letter).
    let purged = sqlx::query("DELETE FROM inbox WHERE event_id = $1")
        .bind(first)
        .execute(&db.pool)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(purged, 1, "the first event's inbox row");

    // Another event dead-lettered and fixed; --all again.
    let second = refused_order_paid(&db, &envs, &brokers, &topic).await;
    let sent = redrive_all(&envs).await;
    let ids: Vec<&str> = sent.iter().filter_map(|r| r["event_id"].as_str()).collect();
    // Whatever was sent has been consumed before the state is read.
    wait_consumed(&brokers, &group, &sent).await;
    let first_reapplied = e2e::fulfilment::in_inbox(&db.pool, &first.to_string()).await;
    assert_eq!(
        ids,
        [second.to_string()],
        "--all sends only the letter not redriven yet (first event {first}, inbox row re-created: {first_reapplied})"
    );
    assert!(!first_reapplied, "the first event was applied again");
    assert_eq!(reserved().await, 2, "one reservation per order");
    drop(consumer);
}
