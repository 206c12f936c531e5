//! What goes on the wire besides JSON (docs/src/publishing.md, "Payloads, tombstones and keys"; "CloudEvents"):
//! binary payloads byte for byte, tombstones, per-event keys, CloudEvents in binary mode, and an
//! outbox with rows in it migrating to all that. Real PostgreSQL, the shared broker, the relay as
//! a process; what landed is read back with kafka-python (and the cloudevents SDK).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use e2e::proc::{relay_cli, RelayArgs, RelayProcess};
use e2e::verify::Record;
use outbox_consumer::{ConsumerMetrics, Effect, Event, Handler, HandlerError, MessageValue};
use outbox_writer::{enqueue, NewEvent};
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Binary values worth sending: every byte value, invalid UTF-8, NULs, nothing at all (an
/// empty value, which is not a tombstone), bytes that look like JSON but are not to be
/// touched, and a larger random one.
fn binary_values() -> Vec<Vec<u8>> {
    vec![
        (0..=255u8).collect(),
        vec![
            0xff, 0xfe, 0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28, 0xa1, 0xed, 0xa0, 0x80,
        ],
        vec![0, 0, 0, 0],
        Vec::new(),
        br#"{"b": 1,   "a": 2}"#.to_vec(),
        (0..4096).map(|_| rand::random::<u8>()).collect(),
    ]
}

/// What one event is.
#[derive(Debug, Clone)]
enum Kind {
    Json(Value),
    Binary(Vec<u8>, Option<&'static str>),
    Tombstone,
}

/// One written event and what must arrive for it.
#[derive(Debug, Clone)]
struct Written {
    event_id: Uuid,
    aggregate_id: String,
    /// Position within its aggregate.
    seq: usize,
    /// The Kafka key it must carry.
    key: String,
    kind: Kind,
    /// The row's `payload::text` for a JSON event (the exact value bytes on the wire), and its
    /// `created_at`; read from the outbox before the relay starts.
    json_text: Option<String>,
    created_at: Option<DateTime<Utc>>,
}

/// Writes `event` with a plain INSERT (no library), returning its event id.
async fn insert_plain(
    pool: &PgPool,
    aggregate_id: &str,
    key: Option<&str>,
    kind: &Kind,
    headers: &Value,
) -> Uuid {
    let (json, bytes, content_type) = match kind {
        Kind::Json(v) => (Some(v.clone()), None, None),
        Kind::Binary(b, ct) => (None, Some(b.clone()), *ct),
        Kind::Tombstone => (None, None, None),
    };
    sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, payload_bytes, \
                             content_type, message_key, headers) \
         VALUES ('order', $1, 'Thing', $2, $3, $4, $5, $6) RETURNING event_id",
    )
    .bind(aggregate_id)
    .bind(json)
    .bind(bytes)
    .bind(content_type)
    .bind(key)
    .bind(headers)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Writes `event` through `outbox_writer::enqueue`, returning its event id.
async fn insert_kit(
    pool: &PgPool,
    aggregate_id: &str,
    key: Option<&str>,
    kind: &Kind,
    headers: &Value,
) -> Uuid {
    let mut event = match kind {
        Kind::Json(v) => NewEvent::new("order", aggregate_id, "Thing", v),
        Kind::Binary(b, ct) => NewEvent::binary("order", aggregate_id, "Thing", b, *ct),
        Kind::Tombstone => NewEvent::tombstone("order", aggregate_id, "Thing"),
    };
    if let Some(k) = key {
        event = event.with_key(k);
    }
    event.headers = Some(headers);
    let mut tx = pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &event).await.unwrap().event_id;
    tx.commit().await.unwrap();
    id
}

/// Six aggregates of 12 events each, cycling JSON, binary and tombstone: even aggregates written
/// with plain SQL, odd ones with `outbox_writer::enqueue`; `agg-4` keyed `customer-4` throughout,
/// `agg-5` alternating between the keys `k-a` and `k-b`, the others keyed by their aggregate id.
async fn write_mixed_stream(pool: &PgPool, headers: &Value) -> Vec<Written> {
    let binaries = binary_values();
    let content_types = [Some("application/x-protobuf"), None, Some("avro/binary")];
    let mut written = Vec::new();
    for a in 0..6usize {
        let aggregate_id = format!("agg-{a}");
        for seq in 0..12usize {
            let kind = match seq % 3 {
                0 => Kind::Json(json!({"aggregate": aggregate_id, "seq": seq, "text": "ü\"x\n"})),
                1 => Kind::Binary(
                    binaries[(a + seq) % binaries.len()].clone(),
                    content_types[(a + seq) % content_types.len()],
                ),
                _ => Kind::Tombstone,
            };
            let key = match a {
                4 => Some("customer-4".to_owned()),
                5 => Some(if seq % 2 == 0 { "k-a" } else { "k-b" }.to_owned()),
                _ => None,
            };
            let event_id = if a % 2 == 0 {
                insert_plain(pool, &aggregate_id, key.as_deref(), &kind, headers).await
            } else {
                insert_kit(pool, &aggregate_id, key.as_deref(), &kind, headers).await
            };
            written.push(Written {
                event_id,
                aggregate_id: aggregate_id.clone(),
                seq,
                key: key.unwrap_or_else(|| aggregate_id.clone()),
                kind,
                json_text: None,
                created_at: None,
            });
        }
    }
    // The exact JSON text PostgreSQL renders, and each row's time, as the relay will read them.
    let rows: Vec<(Uuid, Option<String>, DateTime<Utc>)> =
        sqlx::query_as("SELECT event_id, payload::text, created_at FROM outbox")
            .fetch_all(pool)
            .await
            .unwrap();
    let rows: HashMap<Uuid, (Option<String>, DateTime<Utc>)> =
        rows.into_iter().map(|(id, t, at)| (id, (t, at))).collect();
    for w in &mut written {
        let (text, at) = rows[&w.event_id].clone();
        w.json_text = text;
        w.created_at = Some(at);
    }
    written
}

fn unhex(h: &Option<String>) -> Option<Vec<u8>> {
    h.as_ref().map(|h| hex::decode(h).unwrap())
}

/// The value bytes and content type that must arrive for `w`.
fn expected_value(w: &Written) -> (Option<Vec<u8>>, Option<&str>) {
    match &w.kind {
        Kind::Json(_) => (Some(w.json_text.clone().unwrap().into_bytes()), None),
        Kind::Binary(b, ct) => (
            Some(b.clone()),
            Some(ct.unwrap_or("application/octet-stream")),
        ),
        Kind::Tombstone => (None, None),
    }
}

/// The first occurrence of each event on the broker.
fn first_occurrences(records: &[Record]) -> HashMap<Uuid, &Record> {
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut first = HashMap::new();
    for r in sorted {
        let id: Uuid = r.headers["event_id"].parse().unwrap();
        first.entry(id).or_insert(r);
    }
    first
}

async fn start_relay(
    db: &e2e::db::TestDb,
    prefix: &str,
    name: &str,
    extra: &[&str],
) -> RelayProcess {
    let mut args = RelayArgs::new(&db.url, &e2e::kafka_brokers(), prefix, name);
    args.extra = extra.iter().map(|s| (*s).to_owned()).collect();
    RelayProcess::start(&args)
}

async fn drained(pool: &PgPool) {
    e2e::wait_for("the outbox to drain", Duration::from_secs(60), || async {
        matches!(e2e::db::backlog(pool).await, Ok(0)).then_some(())
    })
    .await;
}

async fn read_back(topic: &str, n: usize, cloudevents: bool) -> Vec<Record> {
    let (brokers, topics) = (e2e::kafka_brokers(), vec![topic.to_owned()]);
    tokio::task::spawn_blocking(move || {
        if cloudevents {
            e2e::verify::dump_cloudevents(&brokers, &topics, n)
        } else {
            e2e::verify::dump_bytes(&brokers, &topics, n)
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_json_and_tombstone_events_arrive_byte_for_byte_keyed_and_in_order() {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    let written = write_mixed_stream(&db.pool, &json!({})).await;
    let relay = start_relay(&db, &prefix, "relay-wire", &[]).await;
    drained(&db.pool).await;
    let records = read_back(&format!("{prefix}order"), written.len(), false).await;
    drop(relay);

    let first = first_occurrences(&records);
    let mut seen_empty_binary = false;
    for w in &written {
        let r = first
            .get(&w.event_id)
            .unwrap_or_else(|| panic!("{} ({:?}) never arrived", w.event_id, w.kind));
        assert_eq!(
            unhex(&r.key_hex).as_deref(),
            Some(w.key.as_bytes()),
            "key of {w:?}"
        );
        assert_eq!(
            r.headers["aggregate_id"], w.aggregate_id,
            "aggregate header"
        );
        let (value, content_type) = expected_value(w);
        assert_eq!(unhex(&r.value_hex), value, "value of {w:?}");
        assert_eq!(
            r.headers.get("content-type").map(String::as_str),
            content_type,
            "content-type of {w:?}"
        );
        if let Kind::Json(v) = &w.kind {
            let arrived: Value = serde_json::from_slice(&unhex(&r.value_hex).unwrap()).unwrap();
            assert_eq!(&arrived, v, "a JSON value is the one written");
        }
        seen_empty_binary |= matches!(&w.kind, Kind::Binary(b, _) if b.is_empty());
    }
    assert!(seen_empty_binary, "the stream has an empty binary value");

    // Order: per aggregate and key, the first occurrences on their partition follow the
    // aggregate's write order; every event of one key is on one partition.
    let mut by_key: BTreeMap<(String, String), Vec<(&Written, &Record)>> = BTreeMap::new();
    for w in &written {
        by_key
            .entry((w.aggregate_id.clone(), w.key.clone()))
            .or_default()
            .push((w, first[&w.event_id]));
    }
    assert_eq!(by_key.len(), 7, "six aggregates, one of them with two keys");
    for ((aggregate, key), mut events) in by_key {
        let partitions: std::collections::BTreeSet<i32> =
            events.iter().map(|(_, r)| r.partition).collect();
        assert_eq!(
            partitions.len(),
            1,
            "{aggregate}/{key} spread over {partitions:?}"
        );
        events.sort_by_key(|(_, r)| r.offset);
        let seqs: Vec<usize> = events.iter().map(|(w, _)| w.seq).collect();
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(seqs, sorted, "{aggregate}/{key} out of order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_with_two_payloads_or_empty_settings_is_refused_and_nothing_is_written() {
    let db = e2e::db::fresh_database().await;
    for (what, sql) in [
        (
            "both payloads",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, payload_bytes) \
             VALUES ('order', '1', 'T', '{}', '\\x00')",
        ),
        (
            "a content type for JSON",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, content_type) \
             VALUES ('order', '1', 'T', '{}', 'application/json')",
        ),
        (
            "an empty content type",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload_bytes, content_type) \
             VALUES ('order', '1', 'T', '\\x00', '')",
        ),
        (
            "an empty key",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, message_key) \
             VALUES ('order', '1', 'T', '{}', '')",
        ),
    ] {
        let err = sqlx::query(sql).execute(&db.pool).await.unwrap_err();
        let code = err.as_database_error().and_then(|e| e.code()).unwrap_or_default();
        assert_eq!(code, "23514", "{what}: a check violation, got {err}");
    }
    let mut tx = db.pool.begin().await.unwrap();
    for event in [
        NewEvent::binary("order", "1", "T", b"x", Some("")),
        NewEvent::tombstone("order", "1", "T").with_key(""),
    ] {
        let err = enqueue(&mut *tx, &event).await.unwrap_err();
        assert!(
            matches!(err, outbox_writer::OutboxError::Invalid(_)),
            "{event:?}: {err}"
        );
    }
    tx.commit().await.unwrap();
    assert_eq!(
        e2e::db::backlog(&db.pool).await.unwrap(),
        0,
        "nothing was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_cloudevents_on_every_message_is_a_valid_binary_mode_cloudevent_of_its_row() {
    const SOURCE: &str = "urn:example:orders";
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    // A forged ce_id and an extension attribute from the writer's headers.
    let headers = json!({"ce_id": "forged", "ce_tenant": "acme"});
    let written = write_mixed_stream(&db.pool, &headers).await;
    let relay = start_relay(
        &db,
        &prefix,
        "relay-ce",
        &["--cloudevents", "--cloudevents-source", SOURCE],
    )
    .await;
    drained(&db.pool).await;
    let records = read_back(&format!("{prefix}order"), written.len(), true).await;
    drop(relay);

    let first = first_occurrences(&records);
    for w in &written {
        let r = first[&w.event_id];
        let ce = r.cloudevent.as_ref().expect("read as a CloudEvent");
        assert!(ce.get("error").is_none(), "the SDK refused {w:?}: {ce}");
        assert_eq!(ce["problems"], json!([]), "{w:?}");
        let a = &ce["attributes"];
        let (value, content_type) = expected_value(w);
        let time = w
            .created_at
            .unwrap()
            .to_rfc3339_opts(SecondsFormat::Micros, true);
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(a["id"], w.event_id.to_string(), "ce_id is the event id");
        assert_eq!(a["source"], SOURCE);
        assert_eq!(a["type"], "Thing");
        assert_eq!(a["subject"], w.aggregate_id);
        assert_eq!(a["time"], time.as_str(), "ce_time is the row's created_at");
        assert_eq!(a["partitionkey"], w.key, "the binding maps the key");
        assert_eq!(a["tenant"], "acme", "extension attributes pass through");
        let want_ct = match &w.kind {
            Kind::Json(_) => Some("application/json"),
            _ => content_type,
        };
        assert_eq!(
            a.get("datacontenttype").and_then(Value::as_str),
            want_ct,
            "{w:?}"
        );
        assert_eq!(
            ce["data_hex"].as_str().map(|h| hex::decode(h).unwrap()),
            value,
            "data of {w:?}"
        );
        // Our own headers stay.
        assert_eq!(r.headers["event_id"], w.event_id.to_string());
        assert_eq!(r.headers["event_type"], "Thing");
    }

    // Off (the default): no ce_ header of the relay's, no content type on JSON, and the SDK
    // does not take the message for a CloudEvent.
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    let written = write_mixed_stream(&db.pool, &json!({})).await;
    let relay = start_relay(&db, &prefix, "relay-no-ce", &[]).await;
    drained(&db.pool).await;
    let records = read_back(&format!("{prefix}order"), written.len(), true).await;
    drop(relay);
    assert!(records.len() >= written.len());
    for r in &records {
        assert!(
            r.headers.keys().all(|k| !k.starts_with("ce_")),
            "a ce_ header with CloudEvents off: {r:?}"
        );
        let ce = r.cloudevent.as_ref().unwrap();
        assert!(ce.get("error").is_some(), "not a CloudEvent: {ce}");
    }
}

/// Records what the handler was given: a tombstone, bytes, or JSON.
struct Recorder;

impl Handler for Recorder {
    fn versions(&self, event_type: &str) -> Option<&'static [u32]> {
        (event_type == "Thing").then_some(&[1])
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let (kind, bytes) = match &event.value {
            MessageValue::Json => ("json", event.payload.to_string().into_bytes()),
            MessageValue::Binary {
                content_type,
                bytes,
            } => (content_type.as_str(), bytes.clone()),
            MessageValue::Tombstone => ("tombstone", Vec::new()),
        };
        assert_eq!(event.is_tombstone(), kind == "tombstone");
        sqlx::query("INSERT INTO handled (event_id, kind, bytes) VALUES ($1, $2, $3)")
            .bind(event.event_id())
            .bind(kind)
            .bind(bytes)
            .execute(&mut *conn)
            .await?;
        Ok(Effect::Changed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_handler_receives_tombstones_and_binary_values_as_such() {
    let db = e2e::db::fresh_database().await;
    outbox_writer::schema::migrate_inbox(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE handled (event_id uuid PRIMARY KEY, kind text NOT NULL, bytes bytea NOT NULL)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let written = write_mixed_stream(&db.pool, &json!({})).await;
    let relay = start_relay(&db, &prefix, "relay-consumed", &[]).await;
    drained(&db.pool).await;

    let registry = prometheus::Registry::new();
    let metrics = ConsumerMetrics::register(&registry, "recorder").unwrap();
    let shutdown = CancellationToken::new();
    let config = crate::common::runtime_config("recorder", &topic, 3, 64);
    let task = tokio::spawn(outbox_consumer::run(
        config,
        db.pool.clone(),
        Arc::new(Recorder),
        metrics.clone(),
        shutdown.clone(),
    ));
    e2e::wait_for(
        "the handler to get every event",
        Duration::from_secs(90),
        || async {
            (e2e::fulfilment::count(&db.pool, "SELECT count(*) FROM handled").await
                == written.len() as i64)
                .then_some(())
        },
    )
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    drop(relay);

    let handled: HashMap<Uuid, (String, Vec<u8>)> =
        sqlx::query_as::<_, (Uuid, String, Vec<u8>)>("SELECT event_id, kind, bytes FROM handled")
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .into_iter()
            .map(|(id, k, b)| (id, (k, b)))
            .collect();
    for w in &written {
        let (kind, bytes) = &handled[&w.event_id];
        match &w.kind {
            Kind::Json(v) => {
                assert_eq!(kind, "json");
                assert_eq!(&serde_json::from_slice::<Value>(bytes).unwrap(), v);
            }
            Kind::Binary(b, ct) => {
                assert_eq!(kind, ct.unwrap_or("application/octet-stream"), "{w:?}");
                assert_eq!(bytes, b, "{w:?}");
            }
            Kind::Tombstone => assert_eq!(kind, "tombstone", "{w:?}"),
        }
    }
    assert_eq!(
        metrics.messages.with_label_values(&["dead_lettered"]).get(),
        0,
        "nothing was dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outbox_with_rows_migrates_and_old_and_new_writers_publish_unchanged() {
    let db = e2e::db::empty_database().await;
    // The outbox as it was before the wire formats migration, with rows in it.
    let mut before = outbox_writer::schema::migrator();
    before.migrations = before
        .migrations
        .iter()
        .filter(|m| m.version < 20260101000004)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    assert_eq!(before.migrations.len(), 3);
    before.run(&db.pool).await.unwrap();
    let old_insert = |aggregate: String, n: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
                 VALUES ('order', $1, 'Old', jsonb_build_object('n', $2::bigint), '{\"v\": \"1\"}') \
                 RETURNING event_id",
            )
            .bind(aggregate)
            .bind(n)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let mut written: Vec<(Uuid, String, i64)> = Vec::new();
    for n in 0..40 {
        let aggregate = format!("a-{}", n % 4);
        written.push((old_insert(aggregate.clone(), n).await, aggregate, n));
    }
    let missing: bool = sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM information_schema.columns \
         WHERE table_name = 'outbox' AND column_name = 'payload_bytes')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(missing, "the old schema has no payload_bytes");

    // The real binary applies the new migration to the table with rows in it.
    let out = relay_cli(&["migrate", "--database-url", &db.url]);
    assert!(
        out.status.success(),
        "migrate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE payload IS NOT NULL AND payload_bytes IS NULL \
         AND content_type IS NULL AND message_key IS NULL",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(untouched, 40, "existing rows keep their JSON payload");
    // The old writer keeps writing, and a new one writes bytes, into the same aggregates.
    for n in 40..60 {
        let aggregate = format!("a-{}", n % 4);
        written.push((old_insert(aggregate.clone(), n).await, aggregate, n));
    }
    let binary = insert_kit(
        &db.pool,
        "a-0",
        None,
        &Kind::Binary(vec![0, 159, 146, 150], Some("application/x-protobuf")),
        &json!({}),
    )
    .await;

    let prefix = e2e::unique_topic_prefix();
    let relay = start_relay(&db, &prefix, "relay-migrated", &[]).await;
    drained(&db.pool).await;
    let records = read_back(&format!("{prefix}order"), written.len() + 1, false).await;
    drop(relay);
    let first = first_occurrences(&records);
    for (id, aggregate, n) in &written {
        let r = first.get(id).unwrap_or_else(|| panic!("event {n} missing"));
        assert_eq!(r.key.as_deref(), Some(aggregate.as_str()));
        assert_eq!(
            unhex(&r.value_hex).unwrap(),
            format!("{{\"n\": {n}}}").into_bytes(),
            "event {n} arrives as it always did"
        );
        assert_eq!(r.headers["v"], "1");
        assert!(!r.headers.contains_key("content-type"));
    }
    for a in 0..4 {
        let mut ns: Vec<(i64, i64)> = written
            .iter()
            .filter(|(_, agg, _)| *agg == format!("a-{a}"))
            .map(|(id, _, n)| (first[id].offset, *n))
            .collect();
        ns.sort_unstable();
        assert!(
            ns.windows(2).all(|w| w[0].1 < w[1].1),
            "a-{a} out of order: {ns:?}"
        );
    }
    let r = first[&binary];
    assert_eq!(unhex(&r.value_hex).unwrap(), vec![0, 159, 146, 150]);
    assert_eq!(r.headers["content-type"], "application/x-protobuf");
}
