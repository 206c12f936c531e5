//! The relay's Prometheus metrics and the HTTP server for `/metrics` and `/healthz`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use outbox_process::metrics::Registrar;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Registry,
};
use tokio_util::sync::CancellationToken;

/// All relay metrics, registered in their own registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Events acknowledged by the broker and marked published.
    pub published: IntCounter,
    /// Events whose publish failed, by reason.
    pub publish_failures: IntCounterVec,
    /// Unpublished events (refreshed periodically).
    pub backlog: IntGauge,
    /// Age of the oldest unpublished event.
    pub oldest_age: Gauge,
    /// Event creation (its transaction's start) to broker acknowledgement.
    pub latency: Histogram,
    /// Rows per claimed batch.
    pub batch_size: Histogram,
    /// How long each step of a batch with rows took (`stage`: `claim`, `publish`, `mark`):
    /// where the relay's part of the latency goes.
    pub batch_stage: HistogramVec,
    /// Events sent alone (through the relay's second producer) per batch that had any
    /// suspect: bounded by [`crate::batch::LONE_SENDS_PER_BATCH`].
    pub lone_sends: Histogram,
    /// How late the relay's runtime woke a one-second timer: the time during which no other task
    /// of the process (lease renewal, `/metrics`, the listener) could run.
    pub runtime_stall: Histogram,
    /// Batches claimed while the previous one was in flight, by what became of them (`sent`,
    /// `dropped`: the previous batch did not end clean, or the rows below filled a batch).
    pub claimed_ahead: IntCounterVec,
    /// Rows that committed below a batch claimed ahead (a lower `id`, a later commit) and were
    /// sent before it.
    pub late_rows: IntCounter,
    /// 1 while this instance holds the lease of bucket 0 (with one bucket, the whole outbox's
    /// lease): its holder also does the work the relays share (retention, the orphan sweep).
    pub leader: IntGauge,
    /// Buckets of the outbox this instance holds.
    pub buckets_held: IntGauge,
    /// Buckets of the outbox no relay holds, as this instance last saw them.
    pub buckets_unowned: IntGauge,
    /// Events a committed transaction published that were marked from the bucket's record
    /// (settling), instead of being sent again.
    pub settled: IntCounter,
    /// Database errors seen by the relay loop.
    pub db_errors: IntCounter,
    /// Fencing epoch of the lease this instance holds (0 when it holds none).
    pub lease_epoch: IntGauge,
    /// Per bucket: 1 while this instance holds it, 0 once it let it go.
    pub bucket_held: IntGaugeVec,
    /// Per bucket: the fencing epoch of this instance's lease on it (0 once it let it go).
    pub bucket_epoch: IntGaugeVec,
    /// Parked events by error class (refreshed periodically).
    pub parked: IntGaugeVec,
    /// Events parked by this instance, by error class.
    pub parked_total: IntCounterVec,
    /// Events being retried after a failure, not parked yet.
    pub retrying: IntGauge,
    /// Aggregates held back by a parked event.
    pub blocked_aggregates: IntGauge,
    /// Events waiting behind parked events.
    pub waiting_behind: IntGauge,
    /// Unpublished events per destination topic (bounded: see [`crate::backlog_gauges`]).
    pub backlog_by_topic: IntGaugeVec,
    /// Age of the oldest unpublished event per destination topic.
    pub oldest_age_by_topic: GaugeVec,
    /// Unpublished events per bucket.
    pub backlog_by_bucket: IntGaugeVec,
    /// Age of the oldest unpublished event per bucket.
    pub oldest_age_by_bucket: GaugeVec,
    /// Age of the oldest open transaction of the database (it holds back vacuum).
    pub db_oldest_transaction_age: Gauge,
    /// 1 while every Kafka broker is unreachable for this instance's producer.
    pub broker_down: IntGauge,
    /// Rows the retention purge of `outbox_discarded` removed and has still to remove.
    pub retention: outbox_process::retention::RetentionMetrics,
    healthy: Arc<AtomicBool>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Panics
    /// Never: the names are constants, valid and unique.
    pub fn new() -> Self {
        Self::register(Registry::new()).expect("valid, unique metric names")
    }

    fn register(registry: Registry) -> prometheus::Result<Self> {
        let r = Registrar::new(&registry);
        let metrics = Self {
            published: r.metric(
                "outbox_events_published_total",
                "Events acknowledged by the broker and marked published",
            )?,
            publish_failures: r.metric_vec(
                "outbox_publish_failures_total",
                "Events not published in a batch, by reason",
                &["reason"],
            )?,
            backlog: r.metric("outbox_backlog_events", "Unpublished events in the outbox")?,
            oldest_age: r.metric(
                "outbox_oldest_unpublished_age_seconds",
                "Age of the oldest unpublished event",
            )?,
            latency: r.histogram(
                "outbox_publish_latency_seconds",
                "From the event's created_at (its transaction's start) to the broker's acknowledgement",
                // Finer between 5 and 50 ms, where a healthy relay's p99 falls: a p99
                // interpolated within 10-25 ms said little about a 10 ms target.
                vec![
                    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ],
            )?,
            batch_size: r.histogram(
                "outbox_batch_rows",
                "Rows per claimed batch",
                vec![1.0, 10.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0],
            )?,
            batch_stage: r.histogram_vec(
                "outbox_batch_stage_seconds",
                "Time of each step of a batch with rows, by stage: claim (each claim of rows: the failure view and the claim of the head, the claim ahead of a full batch in flight, the rows below a batch claimed ahead), publish (topics checked, every event sent and its acknowledgement received), mark (published rows deleted and failures recorded, when there was any)",
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0,
                ],
                &["stage"],
            )?,
            lone_sends: r.histogram(
                "outbox_batch_lone_sends",
                "Events of aggregates retried after a failure that a batch sent alone (one at a time, on a producer of their own, beside the batch's other events)",
                vec![0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
            )?,
            runtime_stall: r.histogram(
                "outbox_relay_runtime_stall_seconds",
                "How late the relay's runtime woke a one-second timer: a stall during which no task of the process ran (lease renewal, /metrics); should stay far below a third of --lease-ttl-ms",
                vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0],
            )?,
            claimed_ahead: r.metric_vec(
                "outbox_batches_claimed_ahead_total",
                "Batches claimed while the previous batch was in flight (overlapping its acknowledgements), by outcome: sent, or dropped (the previous batch did not end clean, or the rows below filled a batch; claimed again later)",
                &["outcome"],
            )?,
            late_rows: r.metric(
                "outbox_batch_late_rows_total",
                "Rows found below a batch claimed ahead (a lower id that committed later) and sent before it",
            )?,
            leader: r.metric(
                "outbox_relay_leader",
                "1 while this instance holds the relay lease (with several buckets: bucket 0's, whose holder also runs the retention purge and the orphan sweep)",
            )?,
            buckets_held: r.metric(
                "outbox_relay_buckets_held",
                "Buckets of the outbox this instance holds and publishes",
            )?,
            buckets_unowned: r.metric(
                "outbox_relay_buckets_unowned",
                "Buckets of the outbox no relay holds (their events are not published), as this instance last saw them",
            )?,
            settled: r.metric(
                "outbox_events_settled_total",
                "Events a committed Kafka transaction published whose rows were marked from the bucket's record (after a takeover or an unanswered commit) instead of being sent again",
            )?,
            db_errors: r.metric(
                "outbox_relay_database_errors_total",
                "Database errors seen by the relay loop",
            )?,
            lease_epoch: r.metric(
                "outbox_relay_lease_epoch",
                "Fencing epoch of the lease this instance holds (0 when standing by)",
            )?,
            bucket_held: r.metric_vec(
                "outbox_relay_bucket_held",
                "Per bucket: 1 while this instance holds its lease and publishes it, 0 once it let it go (the holder of a bucket is the instance whose series reads 1)",
                &["bucket"],
            )?,
            bucket_epoch: r.metric_vec(
                "outbox_relay_bucket_epoch",
                "Per bucket: the fencing epoch of this instance's lease on it (bumped by every takeover; 0 once it let it go)",
                &["bucket"],
            )?,
            parked: r.metric_vec(
                "outbox_parked_events",
                "Events parked after failures, waiting for an operator (redrive or discard), by error class",
                &["class"],
            )?,
            parked_total: r.metric_vec(
                "outbox_events_parked_total",
                "Events this instance parked, by error class",
                &["class"],
            )?,
            retrying: r.metric(
                "outbox_retrying_events",
                "Events that failed and are retried with backoff (not parked yet)",
            )?,
            blocked_aggregates: r.metric(
                "outbox_blocked_aggregates",
                "Aggregates whose events wait behind a parked event",
            )?,
            waiting_behind: r.metric(
                "outbox_events_waiting_behind_parked",
                "Events waiting behind a parked event of their aggregate",
            )?,
            backlog_by_topic: r.metric_vec(
                "outbox_backlog_events_by_topic",
                "Unpublished events per destination topic (the 20 largest; the rest as topic=\"other\")",
                &["topic"],
            )?,
            oldest_age_by_topic: r.metric_vec(
                "outbox_oldest_unpublished_age_seconds_by_topic",
                "Age of the oldest unpublished event per destination topic",
                &["topic"],
            )?,
            backlog_by_bucket: r.metric_vec(
                "outbox_backlog_events_by_bucket",
                "Unpublished events per bucket of the outbox",
                &["bucket"],
            )?,
            oldest_age_by_bucket: r.metric_vec(
                "outbox_oldest_unpublished_age_seconds_by_bucket",
                "Age of the oldest unpublished event per bucket of the outbox",
                &["bucket"],
            )?,
            db_oldest_transaction_age: r.metric(
                "outbox_db_oldest_transaction_age_seconds",
                "Age of the oldest open transaction of another session in the outbox's database; it holds back vacuum of the outbox",
            )?,
            broker_down: r.metric(
                "outbox_kafka_brokers_down",
                "1 while librdkafka reports every Kafka broker unreachable for the leading relay's producer (events stay unmarked and are retried); 0 otherwise and on standbys",
            )?,
            retention: outbox_process::retention::RetentionMetrics::register(&registry)?,
            registry,
            healthy: Arc::new(AtomicBool::new(true)),
        };
        for stage in BatchStage::ALL {
            metrics.batch_stage.with_label_values(&[stage.as_str()]);
        }
        for class in crate::failure::FailureClass::ALL {
            metrics.parked.with_label_values(&[class.as_str()]).set(0);
            metrics.parked_total.with_label_values(&[class.as_str()]);
        }
        Ok(metrics)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        outbox_process::metrics::render(&self.registry)
    }

    /// Publishes the parking figures.
    pub fn set_parking(&self, stats: &crate::parking::ParkingStats) {
        for class in crate::failure::FailureClass::ALL {
            let n = stats
                .parked_by_class
                .get(class.as_str())
                .copied()
                .unwrap_or(0);
            self.parked.with_label_values(&[class.as_str()]).set(n);
        }
        self.retrying.set(stats.retrying);
        self.blocked_aggregates.set(stats.blocked_aggregates);
        self.waiting_behind.set(stats.waiting_behind);
    }

    /// Observes how long a step of a batch took.
    pub fn observe_stage(&self, stage: BatchStage, took: std::time::Duration) {
        self.batch_stage
            .with_label_values(&[stage.as_str()])
            .observe(took.as_secs_f64());
    }

    /// Marks the relay loop as (un)healthy for `/healthz`.
    pub fn set_healthy(&self, ok: bool) {
        self.healthy.store(ok, Ordering::Relaxed);
    }

    /// The per-bucket lease gauges: `Some(epoch)` while this instance holds `bucket` under
    /// that epoch, `None` once it let it go.
    pub fn set_bucket_lease(&self, bucket: i16, epoch: Option<i64>) {
        let label = bucket.to_string();
        self.bucket_held
            .with_label_values(&[&label])
            .set(i64::from(epoch.is_some()));
        self.bucket_epoch
            .with_label_values(&[&label])
            .set(epoch.unwrap_or(0));
    }
}

async fn metrics_handler(State(m): State<Metrics>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
}

async fn health_handler(State(m): State<Metrics>) -> impl IntoResponse {
    // A broker refusing the login or the certificate is named, and unhealthy whatever else.
    let refused = outbox_kafka::refusal::current();
    let ok = m.healthy.load(Ordering::Relaxed) && refused.is_none();
    let mut body = serde_json::json!({
        "status": if ok { "ok" } else { "degraded" },
        "leader": m.leader.get() == 1,
    });
    if let Some(reason) = refused {
        body["kafka"] = serde_json::json!(format!("refused ({reason})"));
    }
    let body = Json(body);
    (
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        body,
    )
}

/// Serves `/metrics` and `/healthz` until `shutdown`.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "Serving /metrics and /healthz");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_metric_names_with_units() {
        let m = Metrics::new();
        m.published.inc_by(3);
        m.publish_failures.with_label_values(&["delivery"]).inc();
        m.latency.observe(0.004);
        m.retention.init("outbox_discarded");
        let text = m.render();
        for name in [
            "outbox_events_published_total 3",
            "outbox_publish_failures_total{reason=\"delivery\"} 1",
            "outbox_backlog_events",
            "outbox_oldest_unpublished_age_seconds",
            "outbox_publish_latency_seconds_bucket",
            "outbox_relay_leader",
            "outbox_relay_lease_epoch",
            "outbox_relay_buckets_held 0",
            "outbox_relay_buckets_unowned 0",
            "outbox_events_settled_total 0",
            "outbox_parked_events{class=\"undecodable\"} 0",
            "outbox_events_parked_total{class=\"refused\"} 0",
            "outbox_retrying_events",
            "outbox_blocked_aggregates",
            "outbox_events_waiting_behind_parked",
            "outbox_db_oldest_transaction_age_seconds 0",
            "retention_rows_deleted_total",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}

/// A step of a batch, as `outbox_batch_stage_seconds` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchStage {
    /// A claim of rows: the failure view and the head, the claim ahead of a full batch in
    /// flight, or the rows below a batch claimed ahead.
    Claim,
    /// Topics checked, events sent, acknowledgements received.
    Publish,
    /// Published rows deleted, failures recorded.
    Mark,
}

impl BatchStage {
    /// Every stage.
    pub const ALL: [Self; 3] = [Self::Claim, Self::Publish, Self::Mark];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Publish => "publish",
            Self::Mark => "mark",
        }
    }
}
