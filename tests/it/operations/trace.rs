//! Trace context end to end, through real processes: a request's W3C `traceparent` reaches the
//! outbox row, the relay's Kafka message (read by kafka-python), the consumers' log lines and the
//! events they emit; with `OTEL_EXPORTER_OTLP_ENDPOINT` set, an OTLP receiver sees every hop's
//! span with the parent the message carried.

use std::time::Duration;

use e2e::fulfilment::System;
use e2e::otlp::{kind, ReceivedSpan, Receiver};
use e2e::verify::Record;
use outbox_trace::TraceContext;

/// A trace id and a caller span id of the test's own, and its `traceparent`.
fn caller_traceparent(trace_id: &str) -> (String, String) {
    let span: [u8; 8] = rand::random();
    let span = hex::encode(span);
    (format!("00-{trace_id}-{span}-01"), span)
}

fn random_trace_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// The parsed `traceparent` header of a message, failing when it is missing or malformed.
fn trace_of(r: &Record) -> TraceContext {
    let tp = r
        .headers
        .get("traceparent")
        .unwrap_or_else(|| panic!("no traceparent on {r:?}"));
    TraceContext::parse(tp).unwrap_or_else(|e| panic!("bad traceparent {tp}: {e}"))
}

/// The one message on `topic` with `event_type` that is about `order_id` (key or payload).
fn event<'a>(records: &'a [Record], topic: &str, event_type: &str, order_id: &str) -> &'a Record {
    let found: Vec<&Record> = records
        .iter()
        .filter(|r| r.topic == topic)
        .filter(|r| r.headers.get("event_type").map(String::as_str) == Some(event_type))
        .filter(|r| {
            r.key.as_deref() == Some(order_id)
                || r.value.as_deref().is_some_and(|v| {
                    serde_json::from_str::<serde_json::Value>(v)
                        .is_ok_and(|v| v["order_id"] == order_id)
                })
        })
        .collect();
    assert!(
        !found.is_empty(),
        "no {event_type} of order {order_id} on {topic}"
    );
    found[0]
}

/// The `(trace_id, span_id)` fields of each log line containing every one of `needles`.
fn logged_ids(log: &str, needles: &[&str]) -> Vec<(String, String)> {
    let field = |line: &str, name: &str| -> Option<String> {
        let rest = line.split(&format!("{name}=")).nth(1)?;
        Some(
            rest.split([' ', '}', ':'])
                .next()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    log.lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| Some((field(l, "trace_id")?, field(l, "span_id")?)))
        .collect()
}

/// One order driven through the flow and the `traceparent`s its events carried.
struct TracedOrder {
    order_id: String,
    /// The caller's span ids of `POST /orders` and of the payment callback.
    create_span: String,
    pay_span: String,
    created: TraceContext,
    paid: TraceContext,
    reserved: TraceContext,
    outbound: TraceContext,
}

/// Drives one order through creation, payment and the outbound, the order service's two
/// requests carrying `traceparent`s of trace `trace_id`, and reads the `traceparent` of its
/// `OrderCreated`, `OrderPaid`, `StockReserved` and `OutboundCreated` with kafka-python once
/// everything is published.
async fn traced_order(sys: &System, trace_id: &str) -> TracedOrder {
    sys.sku("sku-t", 700).await;
    sys.set_stock("sku-t", 10).await;
    let (create_tp, create_span) = caller_traceparent(trace_id);
    let (pay_tp, pay_span) = caller_traceparent(trace_id);
    let (order_id, amount) = sys
        .create_order_traced("u-trace", &[("sku-t", 2)], Some(&create_tp))
        .await;
    sys.pay_traced(&order_id, amount, Some(&pay_tp)).await;
    sys.wait_outbound(&order_id, "CREATED").await;
    sys.wait_outboxes_drained().await;
    let topics = ["order", "stock", "outbound"]
        .map(|t| sys.topic(t))
        .to_vec();
    let brokers = sys.brokers.clone();
    let records = tokio::task::spawn_blocking(move || e2e::verify::dump(&brokers, &topics))
        .await
        .unwrap();
    let of = |topic: &str, event_type: &str| {
        trace_of(event(&records, &sys.topic(topic), event_type, &order_id))
    };
    TracedOrder {
        created: of("order", "OrderCreated"),
        paid: of("order", "OrderPaid"),
        reserved: of("stock", "StockReserved"),
        outbound: of("outbound", "OutboundCreated"),
        order_id: order_id.clone(),
        create_span,
        pay_span,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_requests_traceparent_reaches_every_downstream_event_and_consumer_log() {
    let sys = System::start().await;
    let trace_id = random_trace_id();
    let TracedOrder {
        order_id,
        create_span,
        pay_span,
        created,
        paid,
        reserved,
        outbound,
    } = traced_order(&sys, &trace_id).await;
    for (name, ctx) in [
        ("OrderCreated", &created),
        ("OrderPaid", &paid),
        ("StockReserved", &reserved),
        ("OutboundCreated", &outbound),
    ] {
        assert_eq!(ctx.trace_id.to_string(), trace_id, "{name} left the trace");
        assert!(ctx.is_sampled(), "{name} lost the sampled flag");
    }
    // Each hop is a span of its own: the events name the service's span, not the caller's.
    assert_ne!(created.span_id.to_string(), create_span);
    assert_ne!(paid.span_id.to_string(), pay_span);
    let hops = [
        created.span_id,
        paid.span_id,
        reserved.span_id,
        outbound.span_id,
    ];
    for (i, a) in hops.iter().enumerate() {
        assert!(
            hops[i + 1..].iter().all(|b| b != a),
            "hop span ids repeat: {hops:?}"
        );
    }

    // Every log line of a hop carries its ids; the event a hop emitted names that same span.
    let order_log = sys.order.log_text();
    let ids = |trace: &str, span: &outbox_trace::SpanId| (trace.to_owned(), span.to_string());
    assert!(
        logged_ids(&order_log, &["Handled HTTP request", "http.route=/orders "])
            .contains(&ids(&trace_id, &created.span_id)),
        "the order service's POST /orders log line lacks trace {trace_id} span {}",
        created.span_id
    );
    let stock_lines = logged_ids(
        &sys.stock.log_text(),
        &["Stock decision published", &format!("order.id={order_id}")],
    );
    assert_eq!(
        stock_lines,
        [ids(&trace_id, &reserved.span_id)],
        "stock log"
    );
    let wms_lines = logged_ids(
        &sys.wms.log_text(),
        &[
            "Outbound changed",
            "event.name=\"OutboundCreated\"",
            &format!("order.id={order_id}"),
        ],
    );
    assert_eq!(wms_lines, [ids(&trace_id, &outbound.span_id)], "wms log");

    // No traceparent, or a malformed one, is no error: the request starts a trace of its own.
    let mut fresh = Vec::new();
    for tp in [
        None,
        Some("garbage".to_owned()),
        Some(format!(
            "00-{}-00f067aa0ba902b7-01",
            trace_id.to_uppercase()
        )),
        Some(format!("00-{trace_id}-0000000000000000-01")),
    ] {
        let (id, _) = sys
            .create_order_traced("u-trace", &[("sku-t", 1)], tp.as_deref())
            .await;
        fresh.push(id);
    }
    sys.wait_outboxes_drained().await;
    let (brokers, topic) = (sys.brokers.clone(), vec![sys.topic("order")]);
    let records = tokio::task::spawn_blocking(move || e2e::verify::dump(&brokers, &topic))
        .await
        .unwrap();
    let mut traces: Vec<String> = fresh
        .iter()
        .map(|id| trace_of(event(&records, &sys.topic("order"), "OrderCreated", id)))
        .map(|ctx| ctx.trace_id.to_string())
        .collect();
    assert!(
        !traces.contains(&trace_id),
        "a malformed traceparent was continued: {traces:?}"
    );
    traces.sort();
    traces.dedup();
    assert_eq!(
        traces.len(),
        fresh.len(),
        "new traces must differ: {traces:?}"
    );

    for s in [&sys.order, &sys.wms, &sys.stock] {
        assert!(
            !s.log_text().contains("Exporting trace spans"),
            "{} exports spans without OTEL_EXPORTER_OTLP_ENDPOINT",
            s.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_otlp_export_every_hop_is_a_span_under_the_parent_its_message_carried() {
    let receiver = Receiver::start().await;
    let env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            receiver.endpoint.clone(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
    ];
    let sys = System::start_with_env(&e2e::kafka_brokers(), Vec::new(), env).await;
    for s in [&sys.order, &sys.wms, &sys.stock] {
        assert!(
            s.log_text().contains("Exporting trace spans"),
            "{} did not set up export",
            s.name
        );
    }
    let trace_id = random_trace_id();
    let TracedOrder {
        create_span,
        pay_span,
        created,
        paid,
        reserved,
        outbound,
        ..
    } = traced_order(&sys, &trace_id).await;

    // Each message names the relay's PRODUCER span as its parent; that span's parent is the
    // hop that wrote the event. Wait until the receiver has both for every message.
    let hop_pair = |spans: &[ReceivedSpan], id: &outbox_trace::SpanId| {
        let find = |id: &str| {
            spans
                .iter()
                .find(|s| s.trace_id == trace_id && s.span_id == id)
                .cloned()
        };
        let relay = find(&id.to_string())?;
        let writer = find(&relay.parent_span_id)?;
        Some((relay, writer))
    };
    let [(create_relay, create), (pay_relay, pay), (stock_relay, stock), (wms_relay, wms)] =
        e2e::wait_for(
            "the OTLP receiver to get the spans of every hop and of the relays",
            Duration::from_secs(60),
            || async {
                let spans = receiver.spans();
                Some([
                    hop_pair(&spans, &created.span_id)?,
                    hop_pair(&spans, &paid.span_id)?,
                    hop_pair(&spans, &reserved.span_id)?,
                    hop_pair(&spans, &outbound.span_id)?,
                ])
            },
        )
        .await;
    assert_eq!(receiver.undecodable(), 0);
    for (relay, topic) in [
        (&create_relay, sys.topic("order")),
        (&pay_relay, sys.topic("order")),
        (&stock_relay, sys.topic("stock")),
        (&wms_relay, sys.topic("outbound")),
    ] {
        assert_eq!(
            (relay.service.as_str(), relay.kind, relay.name.clone()),
            ("outbox-relay", kind::PRODUCER, format!("send {topic}")),
            "{relay:?}"
        );
        assert!(relay.end_unix_nano >= relay.start_unix_nano, "{relay:?}");
    }
    assert!(
        create_relay.start_unix_nano >= create.start_unix_nano,
        "the relay's span starts when the row was written, inside the request"
    );

    assert_eq!(
        (create.service.as_str(), create.kind, create.name.as_str()),
        ("order-service", kind::SERVER, "POST /orders")
    );
    assert_eq!(
        create.parent_span_id, create_span,
        "POST /orders under the caller's span"
    );
    assert_eq!(
        (pay.service.as_str(), pay.kind, pay.name.as_str()),
        ("order-service", kind::SERVER, "POST /payments/callback")
    );
    assert_eq!(
        pay.parent_span_id, pay_span,
        "the callback under the caller's span"
    );
    // StockReserved was written while the stock consumer handled OrderPaid: its span's parent is
    // the span OrderPaid carried, the relay's that published it.
    assert_eq!(
        (stock.service.as_str(), stock.kind),
        ("stock-consumer", kind::CONSUMER)
    );
    assert_eq!(stock.name, format!("process {}", sys.topic("order")));
    assert_eq!(stock.parent_span_id, paid.span_id.to_string());
    // OutboundCreated was written while the WMS handled StockReserved.
    assert_eq!(
        (wms.service.as_str(), wms.kind),
        ("wms-consumer", kind::CONSUMER)
    );
    assert_eq!(wms.name, format!("process {}", sys.topic("stock")));
    assert_eq!(wms.parent_span_id, reserved.span_id.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_span_starts_when_the_row_was_written_and_ends_at_the_ack() {
    let receiver = Receiver::start().await;
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    let trace_id = random_trace_id();
    let (writer_tp, writer_span) = caller_traceparent(&trace_id);
    let insert = |headers: serde_json::Value| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_as::<_, (uuid::Uuid, chrono::DateTime<chrono::Utc>)>(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
                 VALUES ('order', 'o-1', 'Waited', '{}', $1) RETURNING event_id, created_at",
            )
            .bind(headers)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (traced, written_at) = insert(serde_json::json!({ "traceparent": writer_tp })).await;
    let (untraced, _) = insert(serde_json::json!({})).await;
    // The event waits in the outbox (no relay yet) until the database's clock says 1.5 s went by.
    let waited = e2e::wait_for(
        "the row to have waited 1.5 s",
        Duration::from_secs(30),
        || async {
            let age: f64 = sqlx::query_scalar(
                "SELECT extract(epoch FROM clock_timestamp() - created_at)::float8 FROM outbox \
                 WHERE event_id = $1",
            )
            .bind(traced)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            (age >= 1.5).then_some(age)
        },
    )
    .await;
    let mut args = e2e::proc::RelayArgs::new(&db.url, &e2e::kafka_brokers(), &prefix, "relay-span");
    args.env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            receiver.endpoint.clone(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
    ];
    let relay = e2e::proc::RelayProcess::start(&args);
    let (brokers, topic) = (e2e::kafka_brokers(), vec![format!("{prefix}order")]);
    let records = tokio::task::spawn_blocking(move || e2e::verify::dump_first(&brokers, &topic, 2))
        .await
        .unwrap();
    let message = |id: uuid::Uuid| {
        records
            .iter()
            .find(|r| r.headers["event_id"] == id.to_string())
            .unwrap_or_else(|| panic!("{id} not on the broker: {records:?}"))
    };
    let carried = trace_of(message(traced));
    assert_eq!(
        carried.trace_id.to_string(),
        trace_id,
        "the writer's trace goes on"
    );
    assert_ne!(
        carried.span_id.to_string(),
        writer_span,
        "under the relay's own span"
    );
    assert!(
        !message(untraced).headers.contains_key("traceparent"),
        "an event without a trace gets none"
    );

    let span = e2e::wait_for(
        "the relay's span at the receiver",
        Duration::from_secs(30),
        || async {
            receiver
                .spans()
                .into_iter()
                .find(|s| s.span_id == carried.span_id.to_string())
        },
    )
    .await;
    assert_eq!(
        (span.service.as_str(), span.kind, span.trace_id.as_str()),
        ("outbox-relay", kind::PRODUCER, trace_id.as_str())
    );
    assert_eq!(span.parent_span_id, writer_span, "under the writer's span");
    let written_ns = written_at.timestamp_nanos_opt().unwrap() as u64;
    assert_eq!(
        span.start_unix_nano, written_ns,
        "the span starts at the row's created_at"
    );
    let duration_s = (span.end_unix_nano - span.start_unix_nano) as f64 / 1e9;
    assert!(
        duration_s >= waited,
        "the span ({duration_s:.3} s) covers the {waited:.3} s the event waited in the outbox"
    );
    let relay_spans = receiver
        .spans()
        .into_iter()
        .filter(|s| s.service == "outbox-relay")
        .count();
    assert_eq!(relay_spans, 1, "no span for the event without a trace");
    drop(relay);
}
