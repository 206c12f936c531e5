//! Gauges of business state read from the service's own database on an interval
//! ([`StateGauges`]): money flagged for refund, refunds and holds left open, ship-backs not
//! reported, a compensation watermark that stopped moving. Counters say what happened; these
//! say what is still wrong now, so an alert can fire on its age.
//!
//! Each gauge is one SQL statement: without a label it returns one row of one `float8`; with
//! one label it returns rows of `(text, float8)`, and label values it no longer returns are
//! removed. Keep each statement on an index (a partial index on the open rows), since every
//! replica runs them every interval. A failed sample is logged and leaves the previous values.

use std::time::Duration;

use outbox_process::metrics::Registrar;
use prometheus::{Gauge, GaugeVec, Registry};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// One gauge and the statement that reads it.
#[derive(Debug)]
enum Entry {
    Plain(Gauge, &'static str),
    Labelled(GaugeVec, &'static str),
}

/// Gauges read from the database on an interval (module docs).
#[derive(Debug, Default)]
pub struct StateGauges {
    entries: Vec<Entry>,
}

impl StateGauges {
    /// No gauges.
    pub fn new() -> Self {
        Self::default()
    }

    /// A gauge `name` registered in `registry`, read by `sql` (one row, one `float8`).
    ///
    /// # Panics
    /// An invalid or duplicate metric name (a constant of the calling service).
    #[must_use]
    pub fn gauge(mut self, registry: &Registry, name: &str, help: &str, sql: &'static str) -> Self {
        let gauge = Registrar::new(registry)
            .metric(name, help)
            .expect("valid, unique metric");
        self.entries.push(Entry::Plain(gauge, sql));
        self
    }

    /// A gauge `name` with one label `label`, read by `sql` (rows of `(text, float8)`).
    ///
    /// # Panics
    /// An invalid or duplicate metric name (a constant of the calling service).
    #[must_use]
    pub fn gauge_by(
        mut self,
        registry: &Registry,
        name: &str,
        help: &str,
        label: &str,
        sql: &'static str,
    ) -> Self {
        let gauge = Registrar::new(registry)
            .metric_vec(name, help, &[label])
            .expect("valid, unique metric");
        self.entries.push(Entry::Labelled(gauge, sql));
        self
    }

    /// Reads every gauge once.
    ///
    /// # Errors
    /// The first statement that failed (the gauges read before it keep their new values).
    pub async fn sample(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        for entry in &self.entries {
            match entry {
                Entry::Plain(gauge, sql) => {
                    let value: Option<f64> = sqlx::query_scalar(sql).fetch_one(pool).await?;
                    gauge.set(value.unwrap_or(0.0));
                }
                Entry::Labelled(gauge, sql) => {
                    let rows: Vec<(String, Option<f64>)> =
                        sqlx::query_as(sql).fetch_all(pool).await?;
                    let stale: Vec<String> = gauge_labels(gauge)
                        .into_iter()
                        .filter(|l| !rows.iter().any(|(r, _)| r == l))
                        .collect();
                    for (label, value) in &rows {
                        gauge
                            .with_label_values(&[label.as_str()])
                            .set(value.unwrap_or(0.0));
                    }
                    for label in stale {
                        let _ = gauge.remove_label_values(&[label.as_str()]);
                    }
                }
            }
        }
        Ok(())
    }

    /// Samples now and then every `interval` until `shutdown`.
    pub async fn run(self, pool: PgPool, interval: Duration, shutdown: CancellationToken) {
        if self.entries.is_empty() {
            return;
        }
        loop {
            if let Err(e) = self.sample(&pool).await {
                tracing::warn!(error = %e, "Reading the state gauges failed; keeping the last values");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// The label values `gauge` has series for.
fn gauge_labels(gauge: &GaugeVec) -> Vec<String> {
    use prometheus::core::Collector;
    gauge
        .collect()
        .iter()
        .flat_map(|family| family.get_metric().iter())
        .filter_map(|m| m.get_label().first().map(|l| l.value().to_owned()))
        .collect()
}
