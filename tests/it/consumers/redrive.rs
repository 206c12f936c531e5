//! `stock-consumer dlq list` and `dlq redrive` as processes against a running stock consumer:
//! an event the database refused is dead-lettered, listed, fixed, redriven and applied once; a
//! second redrive is an inbox duplicate; an unknown event id fails with a message. And two
//! consumer groups on one topic (runtimes in this process, the same `dlq` commands): a redrive
//! reaches only the consumer that dead-lettered the event.

use std::sync::Arc;
use std::time::Duration;

use e2e::fulfilment::{count, inbox_duplicates, produce};
use e2e::proc::{workspace_binary, ServiceProcess};
use outbox_kit::consumer::dlq_cli::{self, ConsumerCommand, DlqCommand, RedriveArgs};
use outbox_kit::consumer::{ConsumerMetrics, Effect, Event, Handler, HandlerError, RuntimeConfig};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixed_dead_letter_redriven_is_applied_exactly_once() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let envs: Vec<(String, String)> = [
        ("DATABASE_URL", db.url.as_str()),
        ("KAFKA_BROKERS", brokers.as_str()),
        ("OUTBOX_TOPIC_PREFIX", prefix.as_str()),
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
    let consumer = ServiceProcess::start("stock-consumer", "stock-consumer-dlq", &[], &env_refs);
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
    metrics: ConsumerMetrics,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), outbox_kit::consumer::ConsumerError>>,
}

impl Group {
    /// Starts consumer `name` (group `<topic>-<name>`) on `topic` and waits until it has every
    /// partition of the topic and of its redrive topic.
    async fn start(name: &'static str, topic: &str, pool: &PgPool) -> Self {
        let config = crate::common::runtime_config(name, topic, 2, 16);
        let metrics = ConsumerMetrics::register(&prometheus::Registry::new(), name).unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(outbox_kit::consumer::run(
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
            metrics,
            shutdown,
            task,
        }
    }

    /// Runs a `dlq` command as the binaries do; returns its JSON output.
    async fn dlq(&self, command: DlqCommand) -> Value {
        let mut out = Vec::new();
        dlq_cli::run(&ConsumerCommand::Dlq(command), &self.config, &mut out)
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
    outbox_kit::schema::migrate_inbox(&db.pool).await.unwrap();
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
