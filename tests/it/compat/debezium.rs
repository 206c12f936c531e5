//! Debezium itself in the harness (`e2e::debezium`): its PostgreSQL connector with the Outbox
//! Event Router, run by Kafka Connect on the test's database and the shared broker, read back
//! with kafka-python. What teams coming from Debezium have on their topics today, the reference
//! the relay's Debezium compatibility is held against.

use e2e::debezium::{create_outbox_table, Converter, Debezium, DebeziumOptions};
use e2e::proc::{relay_cli, RelayArgs, RelayProcess};
use serde_json::{json, Value};
use uuid::Uuid;

/// Debezium's outbox table of this test's own schema.
const TABLE: &str = "dbz.outbox";

/// One committed row: its aggregate, its id, its payload as PostgreSQL prints it.
struct Row {
    aggregate_id: &'static str,
    id: Uuid,
    payload_text: String,
}

#[tokio::test(flavor = "multi_thread")]
async fn debezium_routes_each_row_keyed_by_aggregate_id_with_the_payload_text_in_order_per_key() {
    let db = e2e::db::empty_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    let debezium = Debezium::start(&db.url, &brokers, &DebeziumOptions::new(TABLE, &prefix)).await;

    // Two aggregates, three transactions; one payload with nested objects, an array and text
    // beyond ASCII (and quotes and a backslash the JSON escapes).
    let events = [
        (
            "order-1",
            json!({"order_id": "order-1", "status": "CREATED"}),
        ),
        (
            "order-2",
            json!({
                "order_id": "order-2",
                "customer": {"name": "Zoë Ångström", "address": {"city": "Malmö", "zip": "211 22"}},
                "lines": [{"sku": "ランプ", "qty": 2, "note": "☃ \"fragile\" \\ 📦"}],
                "amount_cents": 9900
            }),
        ),
        ("order-1", json!({"order_id": "order-1", "status": "PAID"})),
    ];
    let mut rows = Vec::new();
    for (aggregate_id, payload) in events {
        let id = Uuid::new_v4();
        let payload_text: String = sqlx::query_scalar(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, 'order', $2, 'OrderChanged', $3) RETURNING payload::text",
        )
        .bind(id)
        .bind(aggregate_id)
        .bind(&payload)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        rows.push(Row {
            aggregate_id,
            id,
            payload_text,
        });
    }

    let topic = format!("{prefix}order");
    let mut records = e2e::verify::dump_bytes(&brokers, std::slice::from_ref(&topic), 3);
    assert_eq!(
        records.len(),
        3,
        "three messages on {topic}, got {records:?}; Debezium's log: {}",
        debezium.log_path().display()
    );
    records.sort_by_key(|r| (r.partition, r.offset));
    for aggregate_id in ["order-1", "order-2"] {
        let sent: Vec<&Row> = rows
            .iter()
            .filter(|r| r.aggregate_id == aggregate_id)
            .collect();
        let got: Vec<_> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(aggregate_id))
            .collect();
        assert_eq!(
            got.iter()
                .map(|r| r.headers.get("id").cloned())
                .collect::<Vec<_>>(),
            sent.iter()
                .map(|r| Some(r.id.to_string()))
                .collect::<Vec<_>>(),
            "{aggregate_id}'s events, by their id header, in commit order"
        );
        for (r, row) in got.iter().zip(&sent) {
            assert_eq!(
                r.value_hex.as_deref(),
                Some(hex::encode(row.payload_text.as_bytes()).as_str()),
                "{aggregate_id}: the value is the payload's text, byte for byte ({:?} vs {:?})",
                r.value,
                row.payload_text
            );
            assert_eq!(r.partition, got[0].partition, "one partition per key");
        }
    }
}

/// The rows every comparison writes, per transaction: (aggregate id, event type, tenant, payload
/// as JSON text or NULL, deleted in its own transaction right after the insert).
type Written = (
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    bool,
);

/// JSON with nested objects, nulls, empty arrays and objects, numbers as written, text beyond
/// ASCII and beyond the Basic Multilingual Plane, quotes, a backslash and an escaped control
/// character; a NULL payload; a NULL placed column; a row deleted in the transaction that
/// inserted it (Quarkus' `remove-after-insert`), next to another row of that transaction.
const TRANSACTIONS: [&[Written]; 4] = [
    &[(
        "order-1",
        "OrderCreated",
        Some("acme"),
        Some(
            r#"{"order_id": "order-1", "customer": {"name": "Zoë Ångström", "city": "Malmö"}, "lines": [{"sku": "ランプ", "qty": 2, "note": "☃ \"fragile\" \\ 📦 \u0001"}], "tags": [], "extra": {}, "coupon": null, "amount": 99.50}"#,
        ),
        false,
    )],
    &[
        ("order-2", "OrderCreated", None, Some(r#"[]"#), false),
        ("order-1", "OrderDeleted", Some("acme"), None, false),
    ],
    &[
        (
            "order-3",
            "OrderCreated",
            Some("bolt"),
            Some(r#"{"removed": "right after insert", "big": 12345678901234567890}"#),
            true,
        ),
        (
            "order-2",
            "OrderPaid",
            Some("acme"),
            Some(r#""just a JSON string""#),
            false,
        ),
    ],
    &[(
        "order-1",
        "OrderCreated",
        Some("acme"),
        Some(r#"{"again": true}"#),
        false,
    )],
];

/// Writes [`TRANSACTIONS`] into Debezium's table (with a `tenant` column); returns the event
/// ids in commit order.
async fn write_debezium_rows(pool: &sqlx::PgPool) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for tx_rows in TRANSACTIONS {
        let mut tx = pool.begin().await.unwrap();
        for (aggregate_id, event_type, tenant, payload, delete) in tx_rows {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload, tenant) \
                 VALUES ($1, 'order', $2, $3, $4::jsonb, $5)",
            )
            .bind(id)
            .bind(aggregate_id)
            .bind(event_type)
            .bind(payload)
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .unwrap();
            if *delete {
                let deleted = sqlx::query("DELETE FROM dbz.outbox WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .unwrap()
                    .rows_affected();
                assert_eq!(deleted, 1, "the writer deletes the row it just inserted");
            }
            ids.push(id);
        }
        tx.commit().await.unwrap();
    }
    ids
}

/// The message's `id` header (Debezium's event id).
fn id_header(r: &e2e::verify::Record) -> String {
    r.headers.get("id").cloned().unwrap_or_default()
}

/// Headers as (name, hex or None), sorted, without Debezium's `__debezium.context.*` (they name
/// the connector instance: its name, task and run id; the relay does not reproduce them).
fn router_headers(r: &e2e::verify::Record) -> Vec<(String, Option<String>)> {
    let mut h: Vec<_> = r
        .header_list
        .iter()
        .filter(|(k, _)| !k.starts_with("__debezium.context."))
        .cloned()
        .collect();
    h.sort();
    h
}

/// What a consumer written like Debezium's outbox example consumer makes of a message: the
/// `eventType` header is required; the value is read as a string and parsed as JSON, unwrapped
/// from JsonConverter's `{"schema", "payload"}` envelope and (JsonConverter's `json`) from the
/// JSON string holding the payload's text. `None` for a message without a value.
fn example_consumer(
    r: &e2e::verify::Record,
    json: bool,
) -> Result<(String, Option<Value>), String> {
    let event_type = r
        .headers
        .get("eventType")
        .filter(|t| !t.is_empty())
        .ok_or("no eventType header")?
        .clone();
    let Some(text) = &r.value else {
        return Ok((event_type, None));
    };
    let mut v: Value = serde_json::from_str(text).map_err(|e| format!("{text}: {e}"))?;
    if v.get("schema").is_some() && v.get("payload").is_some() {
        v = v["payload"].take();
    }
    if let (true, Value::String(s)) = (json, &v) {
        v = serde_json::from_str(s).map_err(|e| format!("{s}: {e}"))?;
    }
    Ok((event_type, Some(v)))
}

/// Debezium and the relay on the same table, side by side: Debezium started with `options`
/// (its topics `<prefix><routed-by value>`), the relay installed by `debezium-install` from
/// Debezium's own properties files and then `relay_properties` (a last file; by default only
/// the relay's topics differ, `<prefix>relay.<routed-by value>`, so both can be compared).
struct SideBySide {
    db: e2e::db::TestDb,
    brokers: String,
    prefix: String,
    debezium: Debezium,
    relay: Option<RelayProcess>,
}

impl SideBySide {
    /// `db` holds the table of `options` already, in the shape the test wants; `prefix` is
    /// the test's topic prefix (`options` route to `<prefix><routed-by value>` unless they
    /// say otherwise).
    async fn start(
        db: e2e::db::TestDb,
        prefix: &str,
        options: DebeziumOptions,
        relay_properties: &str,
    ) -> Self {
        let brokers = e2e::kafka_brokers();
        let debezium = Debezium::start(&db.url, &brokers, &options).await;
        let me = Self {
            db,
            brokers,
            prefix: prefix.to_owned(),
            debezium,
            relay: None,
        };
        let relay_properties = if relay_properties.is_empty() {
            format!(
                "transforms.outbox.route.topic.replacement={}relay.${{routedByValue}}\n",
                me.prefix
            )
        } else {
            relay_properties.to_owned()
        };
        let out = me.install(&relay_properties);
        assert!(
            out.status.success(),
            "debezium-install: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        me
    }

    /// Runs `debezium-install` with Debezium's properties files and then `extra` (a file).
    fn install(&self, extra: &str) -> std::process::Output {
        let ours = std::env::temp_dir().join(format!(
            "relay-extra-{:08x}.properties",
            rand::random::<u32>()
        ));
        std::fs::write(&ours, extra).unwrap();
        let [worker, connector] = self.debezium.properties_files();
        let out = relay_cli(&[
            "debezium-install",
            "--database-url",
            &self.db.url,
            "--config",
            worker.to_str().unwrap(),
            "--config",
            connector.to_str().unwrap(),
            "--config",
            ours.to_str().unwrap(),
        ]);
        let _ = std::fs::remove_file(&ours);
        out
    }

    /// Starts the relay on the database (once the rows are written, or before).
    fn start_relay(&mut self) {
        self.relay = Some(RelayProcess::start(&RelayArgs::new(
            &self.db.url,
            &self.brokers,
            &self.prefix,
            "relay-dbz",
        )));
    }

    /// `n` messages of Debezium's topic for `routed` and `n` of the relay's, each sorted by
    /// partition and offset.
    fn messages(
        &self,
        routed: &str,
        n: usize,
    ) -> (Vec<e2e::verify::Record>, Vec<e2e::verify::Record>) {
        self.messages_on(
            &format!("{}{routed}", self.prefix),
            &format!("{}relay.{routed}", self.prefix),
            n,
        )
    }

    /// `n` messages of Debezium's topic `theirs_topic` and `n` of the relay's `ours_topic`,
    /// each sorted by partition and offset.
    fn messages_on(
        &self,
        theirs_topic: &str,
        ours_topic: &str,
        n: usize,
    ) -> (Vec<e2e::verify::Record>, Vec<e2e::verify::Record>) {
        let mut theirs = e2e::verify::dump_bytes(&self.brokers, &[theirs_topic.to_owned()], n);
        let mut ours = e2e::verify::dump_bytes(&self.brokers, &[ours_topic.to_owned()], n);
        assert_eq!(
            theirs.len(),
            n,
            "Debezium's {n} messages ({}): {theirs:?}",
            self.debezium.log_path().display()
        );
        assert_eq!(ours.len(), n, "the relay's {n} messages: {ours:?}");
        theirs.sort_by_key(|r| (r.partition, r.offset));
        ours.sort_by_key(|r| (r.partition, r.offset));
        (theirs, ours)
    }
}

/// For each event id: the relay's message (`ours`) has the key bytes, value bytes, router
/// headers and (when keyed) partition of Debezium's (`theirs`); returns the pairs.
fn assert_same_messages<'a>(
    what: &str,
    ids: &[Uuid],
    theirs: &'a [e2e::verify::Record],
    ours: &'a [e2e::verify::Record],
) -> Vec<(&'a e2e::verify::Record, &'a e2e::verify::Record)> {
    let mut pairs = Vec::new();
    for id in ids {
        let id = id.to_string();
        let t = theirs
            .iter()
            .find(|r| id_header(r) == id)
            .unwrap_or_else(|| panic!("Debezium sent {id}: {theirs:?}"));
        let o = ours
            .iter()
            .find(|r| id_header(r) == id)
            .unwrap_or_else(|| panic!("the relay sent {id}: {ours:?}"));
        assert_eq!(
            o.key_hex, t.key_hex,
            "{what} {id}: key bytes ({:?} vs Debezium's {:?})",
            o.key, t.key
        );
        assert_eq!(
            o.value_hex, t.value_hex,
            "{what} {id}: value bytes ({:?} vs Debezium's {:?})",
            o.value, t.value
        );
        assert_eq!(router_headers(o), router_headers(t), "{what} {id}: headers");
        // A message without a key goes to any partition, with Debezium as with the relay.
        if t.key_hex.is_some() {
            assert_eq!(o.partition, t.partition, "{what} {id}: partition");
        }
        pairs.push((o, t));
    }
    pairs
}

/// Debezium (with `converter`, `route.tombstone.on.empty.payload=tombstones`) and the relay
/// (installed from Debezium's own properties files, routed to another topic) publish the same
/// rows; kafka-python reads both topics, and each pair of messages must have the same key
/// bytes, value bytes, router headers and partition, in the same order per key, and the
/// example consumer must make the same of both.
async fn relay_matches_debezium(converter: Converter, tombstones: bool) {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    sqlx::query("ALTER TABLE dbz.outbox ADD COLUMN tenant text")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut options = DebeziumOptions::new(TABLE, &prefix);
    options.converter = converter;
    options.router.extend([
        (
            "table.fields.additional.placement".to_owned(),
            "type:header:eventType,tenant:header:tenant".to_owned(),
        ),
        (
            "route.tombstone.on.empty.payload".to_owned(),
            tombstones.to_string(),
        ),
    ]);
    let mut both = SideBySide::start(db, &prefix, options, "").await;
    let ids = write_debezium_rows(&both.db.pool).await;
    both.start_relay();

    let json = converter != Converter::String;
    let (theirs, ours) = both.messages("order", ids.len());
    let what = format!("{converter:?}");
    for (o, t) in assert_same_messages(&what, &ids, &theirs, &ours) {
        let id = id_header(t);
        assert_eq!(
            example_consumer(o, json),
            example_consumer(t, json),
            "{converter:?} {id}: what the example consumer makes of it"
        );
        assert!(
            example_consumer(o, json).is_ok(),
            "{converter:?} {id}: {:?}",
            example_consumer(o, json)
        );
    }
    for key in ["order-1", "order-2", "order-3"] {
        let order = |records: &[e2e::verify::Record]| -> Vec<String> {
            records
                .iter()
                .filter(|r| example_key(r) == key)
                .map(id_header)
                .collect()
        };
        assert_eq!(
            order(&ours),
            order(&theirs),
            "{converter:?}: {key}'s events in the same order"
        );
    }
    assert!(
        ours.iter().all(|r| !r.headers.contains_key("event_id")),
        "none of the relay's own headers: {ours:?}"
    );
}

/// The aggregate a message is about, whatever the key converter: `order-N` inside the key.
fn example_key(r: &e2e::verify::Record) -> &'static str {
    let key = r.key.as_deref().unwrap_or_default();
    ["order-1", "order-2", "order-3"]
        .into_iter()
        .find(|k| key.contains(k))
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread")]
async fn with_string_converters_the_relay_sends_debeziums_bytes_headers_and_partitions() {
    relay_matches_debezium(Converter::String, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_json_converters_and_schemas_the_relay_sends_debeziums_bytes_headers_and_partitions() {
    relay_matches_debezium(Converter::Json, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_schemaless_json_converters_and_tombstones_the_relay_sends_debeziums_bytes_headers_and_partitions(
) {
    relay_matches_debezium(Converter::JsonSchemaless, true).await;
}

/// One event the cutover's writer committed.
#[derive(Debug, Clone)]
struct Committed {
    id: Uuid,
    aggregate: usize,
    seq: u64,
    /// Committed surely before the trigger was installed, or surely after Debezium stopped:
    /// exactly one copy may be on the topic.
    once: bool,
}

/// The cutover phases the writer reads: 0 before the install started, 1 until Debezium is
/// stopped, 2 after.
static PHASE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Writes one event at a time, round robin over `aggregates`, each with its sequence number in
/// the payload, until `stop`; a few milliseconds apart (a steady writer, not a flood).
async fn cutover_writer(
    pool: sqlx::PgPool,
    aggregates: usize,
    stop: tokio_util::sync::CancellationToken,
    written: std::sync::Arc<std::sync::Mutex<Vec<Committed>>>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let mut seqs = vec![0u64; aggregates];
    let mut i = 0usize;
    while !stop.is_cancelled() {
        let aggregate = i % aggregates;
        i += 1;
        seqs[aggregate] += 1;
        let seq = seqs[aggregate];
        let id = Uuid::new_v4();
        let before = PHASE.load(SeqCst);
        sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, 'order', $2, 'Step', jsonb_build_object('seq', $3::bigint))",
        )
        .bind(id)
        .bind(format!("agg-{aggregate}"))
        .bind(seq as i64)
        .execute(&pool)
        .await
        .unwrap();
        let after = PHASE.load(SeqCst);
        written.lock().unwrap().push(Committed {
            id,
            aggregate,
            seq,
            once: after == 0 || before == 2,
        });
        tokio::time::sleep(std::time::Duration::from_millis(4)).await;
    }
}

/// The cutover of README "Coming from Debezium", with a writer that never stops: Debezium
/// publishes; `debezium-install --slot` puts the trigger in and waits until Debezium published
/// everything committed before it; the relay starts on the same topic; Debezium is stopped.
/// On the combined topic (kafka-python): every event, each aggregate's first occurrences in
/// commit order, and duplicates only of events committed between the install and Debezium's
/// stop.
#[tokio::test(flavor = "multi_thread")]
async fn cutover_from_a_running_debezium_loses_nothing_and_keeps_each_aggregates_order() {
    use std::sync::atomic::Ordering::SeqCst;
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    let mut options = DebeziumOptions::new(TABLE, &prefix);
    options.converter = Converter::Json;
    let debezium = Debezium::start(&db.url, &brokers, &options).await;
    let slot = debezium.slot.clone();
    let [worker, connector] = debezium.properties_files();

    let written = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = tokio::spawn(cutover_writer(
        db.pool.clone(),
        12,
        stop.clone(),
        written.clone(),
    ));
    let count = || written.lock().unwrap().len();
    let wait_written = |n: usize, what: &'static str| {
        let written = written.clone();
        async move {
            e2e::wait_for(what, std::time::Duration::from_secs(120), || {
                let written = written.clone();
                async move { (written.lock().unwrap().len() >= n).then_some(()) }
            })
            .await
        }
    };
    wait_written(150, "150 events written under Debezium").await;

    PHASE.store(1, SeqCst);
    let install = {
        let (db_url, worker, connector, slot) = (
            db.url.clone(),
            worker.clone(),
            connector.clone(),
            slot.clone(),
        );
        tokio::task::spawn_blocking(move || {
            relay_cli(&[
                "debezium-install",
                "--database-url",
                &db_url,
                "--config",
                worker.to_str().unwrap(),
                "--config",
                connector.to_str().unwrap(),
                "--slot",
                &slot,
                "--slot-timeout-secs",
                "120",
            ])
        })
        .await
        .unwrap()
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
    assert!(install.status.success(), "debezium-install --slot: {said}");
    assert!(
        said.contains(&format!("waiting until slot {slot} confirmed")),
        "{said}"
    );
    let _relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "relay-cutover"));
    let n = count();
    wait_written(n + 150, "150 more events while both publish").await;

    drop(debezium);
    PHASE.store(2, SeqCst);
    let n = count();
    wait_written(n + 150, "150 more events after Debezium stopped").await;
    stop.cancel();
    writer.await.unwrap();
    e2e::wait_for(
        "the relay drained the outbox",
        std::time::Duration::from_secs(120),
        || async { (e2e::db::backlog(&db.pool).await.unwrap() == 0).then_some(()) },
    )
    .await;

    let written = written.lock().unwrap().clone();
    let topic = format!("{prefix}order");
    let records = {
        let (brokers, topic, n) = (brokers.clone(), topic.clone(), written.len());
        tokio::task::spawn_blocking(move || e2e::verify::dump_bytes(&brokers, &[topic], n))
            .await
            .unwrap()
    };
    let mut records = records;
    records.sort_by_key(|r| (r.partition, r.offset));
    let mut copies: std::collections::HashMap<String, usize> = Default::default();
    for r in &records {
        *copies.entry(id_header(r)).or_default() += 1;
    }
    let mut duplicated = 0;
    for e in &written {
        let c = copies.get(&e.id.to_string()).copied().unwrap_or(0);
        assert!(
            c >= 1,
            "event {} (agg-{} #{}) was lost in the cutover",
            e.id,
            e.aggregate,
            e.seq
        );
        assert!(c <= 2, "event {} arrived {c} times", e.id);
        if c == 2 {
            duplicated += 1;
            assert!(
                !e.once,
                "event {} (agg-{} #{}) was committed outside the cutover window, yet arrived twice",
                e.id, e.aggregate, e.seq
            );
        }
    }
    for aggregate in 0..12 {
        let key = format!("agg-{aggregate}");
        let mine: Vec<&e2e::verify::Record> = records
            .iter()
            .filter(|r| {
                r.key
                    .as_deref()
                    .is_some_and(|k| k.contains(&format!("\"{key}\"")))
            })
            .collect();
        assert!(
            mine.windows(2).all(|w| w[0].partition == w[1].partition),
            "{key}: one partition"
        );
        let mut seen = std::collections::HashSet::new();
        let firsts: Vec<u64> = mine
            .iter()
            .filter(|r| seen.insert(id_header(r)))
            .map(|r| {
                // JsonConverter with schemas: the payload's text in the envelope's payload.
                let value: Value = serde_json::from_str(r.value.as_deref().unwrap()).unwrap();
                let payload: Value =
                    serde_json::from_str(value["payload"].as_str().unwrap()).unwrap();
                payload["seq"].as_u64().unwrap()
            })
            .collect();
        let expected: Vec<u64> = (1..=firsts.len() as u64).collect();
        assert_eq!(
            firsts, expected,
            "{key}: first occurrences in commit order, none missing"
        );
    }
    eprintln!(
        "cutover: {} events, {} messages, {duplicated} duplicated (committed between the install and Debezium's stop)",
        written.len(),
        records.len()
    );
}

/// A fresh database with Debezium's table `dbz.outbox` and the relay's copy installed by
/// `debezium-install` from properties naming `converter` for keys and values (Debezium itself
/// is not started: the tests using this check the copy inside PostgreSQL).
async fn installed_without_debezium(converter: &str) -> e2e::db::TestDb {
    let db = e2e::db::fresh_database().await;
    create_outbox_table(&db.pool, TABLE).await;
    install_from_minimal_properties(&db, converter);
    db
}

/// `debezium-install` on `db`'s `dbz.outbox` from properties naming `converter` for keys and
/// values and nothing else but the table and the router.
fn install_from_minimal_properties(db: &e2e::db::TestDb, converter: &str) {
    let config = std::env::temp_dir().join(format!(
        "relay-install-{:08x}.properties",
        rand::random::<u32>()
    ));
    std::fs::write(
        &config,
        format!(
            "key.converter={converter}\n\
             value.converter={converter}\n\
             table.include.list=dbz.outbox\n\
             transforms=outbox\n\
             transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
        ),
    )
    .unwrap();
    let out = relay_cli(&[
        "debezium-install",
        "--database-url",
        &db.url,
        "--config",
        config.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&config);
    assert!(
        out.status.success(),
        "debezium-install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The copy function runs with its owner's rights (it writes `outbox`, which the Debezium
/// table's writers need no right on). A role with no right on `outbox` (here a writer of the
/// Debezium table) must not turn it on a table of its own and forge events with any topic,
/// key, payload or event id: it may not attach the function at all, and a role that may (given
/// EXECUTE) gets an error from the function for any table but the one it was installed on.
#[tokio::test(flavor = "multi_thread")]
async fn an_unprivileged_role_cannot_forge_outbox_events_through_the_copy_function() {
    let db = installed_without_debezium("org.apache.kafka.connect.storage.StringConverter").await;

    // A writer of the Debezium table, with no right on `outbox`.
    let role = format!("forger_{:08x}", rand::random::<u32>());
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT USAGE ON SCHEMA dbz TO {role}"),
        format!("GRANT INSERT ON dbz.outbox TO {role}"),
    ] {
        sqlx::query(&sql).execute(&db.pool).await.unwrap();
    }
    let forger = sqlx::PgPool::connect(&e2e::roles::as_user(&db.url, &role))
        .await
        .expect("connect as the writer");
    let mut conn = forger.acquire().await.unwrap();
    sqlx::query(
        "CREATE TEMP TABLE forged (id uuid, aggregatetype text, aggregateid text, type text, \
         payload jsonb)",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let attach = "CREATE TRIGGER forge AFTER INSERT ON forged FOR EACH ROW \
                  EXECUTE FUNCTION dbz.outbox_to_outbox_relay()";
    let forge = "INSERT INTO forged VALUES (gen_random_uuid(), 'payments', 'order-1', \
                 'RefundSucceeded', '{\"amount\": 1000000}')";
    let refused = sqlx::query(attach).execute(&mut *conn).await;
    if refused.is_ok() {
        let _ = sqlx::query(forge).execute(&mut *conn).await;
    }
    let forged: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(forged, 0, "the writer's own table reached the outbox");
    let err = refused.expect_err("a role without EXECUTE attached the copy function");
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501"),
        "{err}"
    );

    // Given EXECUTE (a role trusted with triggers, still no right on `outbox`), it may attach
    // the function, which refuses to copy anything but the Debezium table's rows.
    sqlx::query(&format!(
        "GRANT EXECUTE ON FUNCTION dbz.outbox_to_outbox_relay() TO {role}"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(attach).execute(&mut *conn).await.unwrap();
    let err = sqlx::query(forge)
        .execute(&mut *conn)
        .await
        .expect_err("the copy function copied a row of another table");
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("copies only the rows inserted into"),
        "the refusal says why: {err}"
    );
    // The table it was installed on is still copied, for this writer too.
    sqlx::query(
        "INSERT INTO dbz.outbox VALUES (gen_random_uuid(), 'order', 'order-1', 'OrderPaid', '{}')",
    )
    .execute(&mut *conn)
    .await
    .expect("the writer inserts into the Debezium table");
    let copied: Vec<(String, String)> =
        sqlx::query_as("SELECT aggregate_type, event_type FROM outbox")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(copied, [("order".to_owned(), "OrderPaid".to_owned())]);
    drop(conn);
    forger.close().await;
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        sqlx::query(&sql).execute(&db.pool).await.unwrap();
    }
}

/// A writer whose session has `standard_conforming_strings = off` (old drivers, some ORMs)
/// inserts into a JsonConverter Debezium table as any other: the copy is the same bytes. With
/// it off a backslash in a literal is an escape, and the copy's encoder is full of them.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_without_standard_conforming_strings_is_copied_the_same() {
    let db = installed_without_debezium("org.apache.kafka.connect.json.JsonConverter").await;
    // A key and a payload with a quote, a backslash and a control character: the encoder's
    // escaping path.
    let mut copies = Vec::new();
    for setting in ["on", "off"] {
        let mut conn = db.pool.acquire().await.unwrap();
        sqlx::query(&format!("SET standard_conforming_strings = {setting}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query("INSERT INTO dbz.outbox VALUES ($1, 'order', $2, 'OrderPaid', $3::jsonb)")
            .bind(Uuid::new_v4())
            .bind(format!("order \"7\" \\ {setting}\u{1}"))
            .bind(r#"{"note": "a \"quoted\" \\ backslash\u0001"}"#)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("insert with standard_conforming_strings = {setting}: {e}"));
        let copy: (Option<String>, Option<Vec<u8>>) = sqlx::query_as(
            "SELECT message_key, payload_bytes FROM outbox ORDER BY id DESC LIMIT 1",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        copies.push(copy);
    }
    let key = |k: &Option<String>| k.clone().unwrap_or_default();
    assert_eq!(
        key(&copies[1].0),
        key(&copies[0].0).replace(" on", " off"),
        "the key as JsonConverter writes it"
    );
    let text = |b: &Option<Vec<u8>>| {
        String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned()
    };
    assert_eq!(text(&copies[1].1), text(&copies[0].1), "the value's bytes");
}

/// Runs each of `statements` on `pool`.
async fn execute_all(pool: &sqlx::PgPool, statements: &[&str]) {
    for sql in statements {
        sqlx::query(sql)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// `char(n)` values are blank-padded to their width, and Debezium sends them so: a `char(10)`
/// key `order-1` is `order-1   ` (so its partition is that text's), a `char(4)` header `SE` is
/// `SE  `. The relay sends the same bytes, not the unpadded text a cast to `text` gives.
#[tokio::test(flavor = "multi_thread")]
async fn char_columns_keep_their_padding_as_debezium_sends_them() {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    execute_all(
        &db.pool,
        &[
            "ALTER TABLE dbz.outbox ALTER COLUMN aggregateid TYPE char(10)",
            "ALTER TABLE dbz.outbox ADD COLUMN region char(4)",
        ],
    )
    .await;
    let mut options = DebeziumOptions::new(TABLE, &prefix);
    options.converter = Converter::Json;
    options.router.push((
        "table.fields.additional.placement".to_owned(),
        "region:header:region".to_owned(),
    ));
    let mut both = SideBySide::start(db, &prefix, options, "").await;
    let mut ids = Vec::new();
    for (key, region) in [
        ("order-1", Some("SE")),
        ("order-22", None),
        ("order-1", Some("DE")),
    ] {
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload, region) \
             VALUES ($1, 'order', $2, 'OrderPaid', '{}', $3)",
        )
        .bind(id)
        .bind(key)
        .bind(region)
        .execute(&both.db.pool)
        .await
        .unwrap();
        ids.push(id);
    }
    both.start_relay();
    let (theirs, ours) = both.messages("order", ids.len());
    let pairs = assert_same_messages("char(n)", &ids, &theirs, &ours);
    let (o, t) = pairs[0];
    assert!(
        t.key
            .as_deref()
            .is_some_and(|k| k.contains(r#""order-1   ""#)),
        "Debezium sends the padded key: {t:?}"
    );
    assert_eq!(o.headers.get("region").map(String::as_str), Some("SE  "));
}

/// A nullable key column (the install accepts it): Debezium publishes a row whose key is NULL
/// with what the key converter writes for a null (StringConverter: no key at all;
/// JsonConverter: `null`, or the envelope with `"payload":null`). The relay publishes the same
/// bytes, and tells the null key from an empty one; the writer's insert succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_null_key_is_published_as_debezium_publishes_it() {
    for converter in [Converter::String, Converter::Json] {
        let db = e2e::db::fresh_database().await;
        let prefix = e2e::unique_topic_prefix();
        create_outbox_table(&db.pool, TABLE).await;
        execute_all(
            &db.pool,
            &["ALTER TABLE dbz.outbox ALTER COLUMN aggregateid DROP NOT NULL"],
        )
        .await;
        let mut options = DebeziumOptions::new(TABLE, &prefix);
        options.converter = converter;
        let mut both = SideBySide::start(db, &prefix, options, "").await;
        let mut ids = Vec::new();
        for key in [None, Some("order-1"), Some(""), None] {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1, 'order', $2, 'OrderPaid', '{}')",
            )
            .bind(id)
            .bind(key)
            .execute(&both.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{converter:?}: the insert of key {key:?}: {e}"));
            ids.push(id);
        }
        both.start_relay();
        let (theirs, ours) = both.messages("order", ids.len());
        let pairs = assert_same_messages(&format!("{converter:?}"), &ids, &theirs, &ours);
        let (o, t) = pairs[0];
        if converter == Converter::String {
            assert_eq!(t.key_hex, None, "Debezium sends no key: {t:?}");
            assert_eq!(pairs[2].1.key_hex.as_deref(), Some(""), "an empty key");
        }
        assert_eq!(o.key_hex, t.key_hex, "{converter:?}: the null key");
    }
}

/// A writer with `session_replication_role = replica` (bulk loaders, logical-replication
/// targets, `pg_restore --disable-triggers`) fires only the triggers enabled ALWAYS (or for
/// replicas). Debezium decodes the WAL and publishes its rows as any other; so must the relay:
/// the copy fires for that writer, and so does the outbox's insert trigger under it (the
/// aggregate's lock and the id after it: the claim floor and the per-aggregate order rest on
/// it).
#[tokio::test(flavor = "multi_thread")]
async fn rows_of_a_writer_with_the_replica_role_are_published_as_debezium_publishes_them() {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    let mut options = DebeziumOptions::new(TABLE, &prefix);
    options.converter = Converter::Json;
    let mut both = SideBySide::start(db, &prefix, options, "").await;
    let mut conn = both.db.pool.acquire().await.unwrap();
    sqlx::query("SET session_replication_role = replica")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for key in ["order-1", "order-2", "order-1"] {
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, 'order', $2, 'OrderPaid', '{\"bulk\": true}')",
        )
        .bind(id)
        .bind(key)
        .execute(&mut *conn)
        .await
        .unwrap();
        ids.push(id);
    }
    // The outbox's insert trigger gave the copies their ids: it notes the last one it gave in
    // the session (`outbox.id_seen`).
    let (copied, last, seen): (i64, Option<i64>, Option<String>) = sqlx::query_as(
        "SELECT count(*), max(id), current_setting('outbox.id_seen', true) FROM outbox",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(copied, 3, "the replica-role writer's rows were copied");
    assert_eq!(
        seen,
        last.map(|id| id.to_string()),
        "the outbox's insert trigger ran for the copies"
    );
    drop(conn);
    both.start_relay();
    let (theirs, ours) = both.messages("order", ids.len());
    assert_same_messages("replica role", &ids, &theirs, &ours);
}

/// Option values are data in the copy's SQL, never SQL: a header alias with quotes and a
/// backslash (`it's\type'`) and a topic replacement with `\` escapes (Java's replacement
/// syntax: `dbz\.` is `dbz.`) give the relay's messages the header name and topic Debezium
/// gives its own, byte for byte, whatever the writer's `standard_conforming_strings`.
#[tokio::test(flavor = "multi_thread")]
async fn quotes_and_backslashes_in_option_values_reach_the_messages_as_debeziums() {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    let mut options = DebeziumOptions::new(TABLE, &prefix);
    // Written into the properties file as is: `\\` is one backslash to Java's Properties.
    options.router = vec![
        (
            "route.topic.replacement".to_owned(),
            format!(r"{prefix}dbz\\.${{routedByValue}}"),
        ),
        (
            "table.fields.additional.placement".to_owned(),
            r"type:header:it's\\type'".to_owned(),
        ),
    ];
    let mut both = SideBySide::start(
        db,
        &prefix,
        options,
        &format!(r"transforms.outbox.route.topic.replacement={prefix}relay\\.${{routedByValue}}"),
    )
    .await;
    let mut ids = Vec::new();
    for setting in ["on", "off"] {
        let mut conn = both.db.pool.acquire().await.unwrap();
        sqlx::query(&format!("SET standard_conforming_strings = {setting}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, 'order', 'order-1', $2, '{}')",
        )
        .bind(id)
        .bind(format!("Order'Paid\\{setting}"))
        .execute(&mut *conn)
        .await
        .unwrap();
        ids.push(id);
    }
    both.start_relay();
    let (theirs, ours) = both.messages_on(
        &format!("{prefix}dbz.order"),
        &format!("{prefix}relay.order"),
        ids.len(),
    );
    assert_same_messages("escapes", &ids, &theirs, &ours);
    assert_eq!(
        ours[0].headers.get(r"it's\type'").map(String::as_str),
        Some(r"Order'Paid\on"),
        "{ours:?}"
    );
}

/// Kafka Connect gives a connector the key converter its own properties name (`key.converter`,
/// configured with its own `key.converter.*` only), else the worker's (configured with the
/// worker's `key.converter.*`; a connector's `key.converter.*` without the class is then
/// ignored). The relay layers the worker's file and the connector's the same way: a connector
/// naming StringConverter over a worker's JsonConverter with `schemas.enable=true` sends plain
/// keys; a connector setting only `key.converter.schemas.enable=false` over the worker's
/// JsonConverter sends the envelope still. Both against Debezium.
#[tokio::test(flavor = "multi_thread")]
async fn converters_are_layered_as_kafka_connect_layers_them() {
    for (connector, envelope) in [
        (
            (
                "key.converter",
                "org.apache.kafka.connect.storage.StringConverter",
            ),
            false,
        ),
        (("key.converter.schemas.enable", "false"), true),
    ] {
        let db = e2e::db::fresh_database().await;
        let prefix = e2e::unique_topic_prefix();
        create_outbox_table(&db.pool, TABLE).await;
        let mut options = DebeziumOptions::new(TABLE, &prefix);
        options.converter = Converter::Json;
        options
            .connector
            .push((connector.0.to_owned(), connector.1.to_owned()));
        let mut both = SideBySide::start(db, &prefix, options, "").await;
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, 'order', 'order 1', 'OrderPaid', '{}')",
        )
        .bind(id)
        .execute(&both.db.pool)
        .await
        .unwrap();
        both.start_relay();
        let (theirs, ours) = both.messages("order", 1);
        let what = format!("{}={}", connector.0, connector.1);
        assert_same_messages(&what, &[id], &theirs, &ours);
        let key = theirs[0].key.clone().unwrap_or_default();
        assert_eq!(
            key.starts_with(r#"{"schema":"#),
            envelope,
            "{what}: Debezium's key {key}"
        );
    }
}

/// The install copies into the `outbox` it checked: the one its connection's `search_path`
/// finds. Here the path starts with a schema of the application's that exists but holds no
/// outbox (`current_schema()` is that schema): the copy still goes to the relay's outbox, and
/// the writer's insert succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn the_copy_goes_to_the_outbox_the_install_found_on_its_search_path() {
    let db = e2e::db::fresh_database().await;
    create_outbox_table(&db.pool, TABLE).await;
    let (outbox,): (String,) = sqlx::query_as("SELECT to_regclass('outbox')::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    execute_all(
        &db.pool,
        &[
            "CREATE SCHEMA app",
            &format!("ALTER DATABASE \"{name}\" SET search_path = app, public"),
        ],
    )
    .await;
    install_from_minimal_properties(&db, "org.apache.kafka.connect.storage.StringConverter");
    sqlx::query("INSERT INTO dbz.outbox VALUES ($1, 'order', 'order-1', 'OrderPaid', '{}')")
        .bind(Uuid::new_v4())
        .execute(&db.pool)
        .await
        .expect("the writer's insert");
    let copied: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {outbox}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(copied, 1, "the row was copied into {outbox}");
}

/// With a `route.topic.replacement` that does not name `${routedByValue}`, every event goes to
/// one topic, and Debezium keeps a key's events in commit order whatever their routed-by
/// values (one key, one partition, the WAL's order). The relay does too: two transactions
/// writing the same key under two routed-by values, the first inserting before the second
/// and committing after it would (were it not for the insert lock), reach the topic in the
/// order Debezium publishes them.
#[tokio::test(flavor = "multi_thread")]
async fn with_one_topic_for_every_routed_by_value_a_keys_events_keep_debeziums_order() {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    let mut options = DebeziumOptions::new(TABLE, &prefix);
    options.router = vec![("route.topic.replacement".to_owned(), format!("{prefix}all"))];
    let mut both = SideBySide::start(
        db,
        &prefix,
        options,
        &format!("transforms.outbox.route.topic.replacement={prefix}relay.all\n"),
    )
    .await;
    let insert = |routed: &'static str| {
        let id = Uuid::new_v4();
        let sql = sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, $2, 'k-1', 'Changed', '{}')",
        )
        .bind(id)
        .bind(routed);
        (id, sql)
    };
    let mut first = both.db.pool.begin().await.unwrap();
    let (first_id, q) = insert("order");
    q.execute(&mut *first).await.unwrap();
    // The second transaction inserts and commits (or waits at its insert for the first).
    let (second_id, q) = insert("payment");
    let pool = both.db.pool.clone();
    let second = tokio::spawn(async move {
        let mut tx = pool.begin().await.unwrap();
        q.execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
    });
    let pool = both.db.pool.clone();
    let second_ref = &second;
    e2e::wait_for(
        "the second transaction committed or waits for the first",
        std::time::Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                (waiting > 0 || second_ref.is_finished()).then_some(())
            }
        },
    )
    .await;
    first.commit().await.unwrap();
    second.await.unwrap();
    both.start_relay();
    let ids = [first_id, second_id];
    let (theirs, ours) =
        both.messages_on(&format!("{prefix}all"), &format!("{prefix}relay.all"), 2);
    assert_same_messages("one topic", &ids, &theirs, &ours);
    assert_eq!(
        ours.iter().map(id_header).collect::<Vec<_>>(),
        theirs.iter().map(id_header).collect::<Vec<_>>(),
        "k-1's events in Debezium's order"
    );
}

/// Debezium's documented path for Avro or Protobuf outboxes: the application serialises, the
/// payload column is `bytea`, the value converter writes its bytes as they are (Debezium's
/// `BinaryDataConverter`, here with the `delegate.converter.type` its documentation gives, or
/// Kafka's `ByteArrayConverter`). The relay publishes each row with Debezium's value bytes
/// (bytes that are no UTF-8, an empty payload, a NULL one), key, headers and partition.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_binary_value_converter_a_bytea_payload_is_published_as_debeziums_bytes() {
    for (class, options) in [
        (
            "io.debezium.converters.BinaryDataConverter",
            &[(
                "value.converter.delegate.converter.type",
                "org.apache.kafka.connect.json.JsonConverter",
            )][..],
        ),
        (
            "org.apache.kafka.connect.converters.ByteArrayConverter",
            &[][..],
        ),
    ] {
        let db = e2e::db::fresh_database().await;
        let prefix = e2e::unique_topic_prefix();
        create_outbox_table(&db.pool, TABLE).await;
        execute_all(
            &db.pool,
            &[
                "ALTER TABLE dbz.outbox DROP COLUMN payload",
                "ALTER TABLE dbz.outbox ADD COLUMN payload bytea",
            ],
        )
        .await;
        let mut options_ = DebeziumOptions::new(TABLE, &prefix);
        options_.router.push((
            "table.fields.additional.placement".to_owned(),
            "type:header:eventType".to_owned(),
        ));
        options_
            .connector
            .push(("value.converter".to_owned(), class.to_owned()));
        for (k, v) in options {
            options_.connector.push(((*k).to_owned(), (*v).to_owned()));
        }
        let mut both = SideBySide::start(db, &prefix, options_, "").await;
        // An Avro-like record (magic byte, schema id, then no UTF-8), an empty payload, a NULL.
        let payloads: [Option<&[u8]>; 4] = [
            Some(&[0x00, 0x00, 0x00, 0x00, 0x2a, 0x02, 0xff, 0xfe, 0x80, 0x0a]),
            Some(&[]),
            None,
            Some(b"{\"plain\": \"text\"}"),
        ];
        let mut ids = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1, 'order', $2, 'OrderPaid', $3)",
            )
            .bind(id)
            .bind(format!("order-{}", i % 2))
            .bind(payload)
            .execute(&both.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{class}: the insert: {e}"));
            ids.push(id);
        }
        both.start_relay();
        let (theirs, ours) = both.messages("order", ids.len());
        let pairs = assert_same_messages(class, &ids, &theirs, &ours);
        for ((o, _), payload) in pairs.iter().zip(payloads) {
            assert_eq!(
                o.value_hex,
                payload.map(hex::encode),
                "{class}: the value is the column's bytes (none for NULL)"
            );
        }
    }
}

/// Payloads for `table.expand.json.payload=true`: nested objects, an empty one, nulls, empty
/// arrays, an array of objects whose shapes are prefixes of the longest, floats written in
/// and out of Java's plain range, int32 and int64, strings beyond the Basic Multilingual Plane
/// and with escapes; and those Debezium keeps a string: a JSON string, `[]`, an array of mixed
/// types, of mixed number kinds, of nulls only.
const EXPANDED: [&str; 8] = [
    r#"{"order_id": "order-1", "customer": {"name": "Zoë", "address": {"city": "Malmö"}, "vip": false}, "lines": [{"sku": "ランプ", "qty": 2}, {"sku": "☃ \"x\" \\ 📦", "qty": 3, "note": null}], "same": [{"k": 1}, null, {"k": 2}], "id64": 3000000000, "tags": [], "extra": {}, "coupon": null, "amount": 99.50, "tiny": 0.0001, "big": 12345678.9, "few": [1, 2], "nested": [[1.5], [2.25]]}"#,
    r#"{}"#,
    r#""just a JSON string""#,
    r#"[]"#,
    r#"{"mixed": [1, "one"]}"#,
    r#"{"numbers": [1, 3000000000]}"#,
    r#"{"nulls": [null, null], "x": 1}"#,
    r#"{"a": {"b": {"c": [{"d": 1.0E-7}]}}}"#,
];

/// `table.expand.json.payload=true` with a schemaless JsonConverter, for both
/// `table.json.payload.null.behavior` values: the relay's value bytes are Debezium's (the
/// expanded object as JsonConverter writes it, or the payload's string where Debezium keeps
/// it one, or `null`), with its key, headers and partition. A payload Debezium's connector
/// would stop at (a top-level array) fails the writer's insert, naming the option.
#[tokio::test(flavor = "multi_thread")]
async fn with_expand_json_payload_and_schemaless_json_the_relay_sends_debeziums_bytes() {
    for nulls in ["ignore", "optional_bytes"] {
        let db = e2e::db::fresh_database().await;
        let prefix = e2e::unique_topic_prefix();
        create_outbox_table(&db.pool, TABLE).await;
        let mut options = DebeziumOptions::new(TABLE, &prefix);
        options.converter = Converter::JsonSchemaless;
        options.router.extend([
            ("table.expand.json.payload".to_owned(), "true".to_owned()),
            (
                "table.json.payload.null.behavior".to_owned(),
                nulls.to_owned(),
            ),
        ]);
        let mut both = SideBySide::start(db, &prefix, options, "").await;
        let mut ids = Vec::new();
        for payload in EXPANDED.iter().map(|p| Some(*p)).chain([None]) {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1, 'order', 'order-1', 'OrderPaid', $2::jsonb)",
            )
            .bind(id)
            .bind(payload)
            .execute(&both.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{nulls}: the insert of {payload:?}: {e}"));
            ids.push(id);
        }
        let refused = sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, 'order', 'order-1', 'OrderPaid', '[1]')",
        )
        .bind(Uuid::new_v4())
        .execute(&both.db.pool)
        .await
        .expect_err("a top-level array is refused at the insert");
        assert!(
            refused.to_string().contains("table.expand.json.payload"),
            "{refused}"
        );
        both.start_relay();
        let (theirs, ours) = both.messages("order", ids.len());
        let pairs = assert_same_messages(nulls, &ids, &theirs, &ours);
        assert!(
            pairs[0]
                .1
                .value
                .as_deref()
                .is_some_and(|v| v.starts_with(r#"{"big":"#)),
            "Debezium expanded the first payload: {:?}",
            pairs[0].1.value
        );
    }
}
