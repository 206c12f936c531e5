//! The results: one serializable report (written as JSON) and the table printed on stdout.
//!
//! The headline table (throughput, CPU per event, ratios, latency) is `table`; the tables of
//! the phases beside the headline run (isolation, insert, failures, parked, backlog, growth)
//! are `phases`, those comparing two ways of publishing (transactions off and on, Debezium and
//! the relay) `comparisons`; `format` writes their figures.

use serde::Serialize;

use crate::backlog::BacklogFigures;
use crate::cli::Sizes;
use crate::db::DbFigures;
use crate::drain::DrainFigures;
use crate::failures::FailuresFigures;
use crate::growth::GrowthFigures;
use crate::infra::ServerSettings;
use crate::insert::InsertFigures;
use crate::isolation::IsolationFigures;
use crate::latency::LatencyFigures;
use crate::naive::NaiveFigures;
use crate::produce::ProduceFigures;
use crate::transactions::TransactionsFigures;

mod comparisons;
mod format;
mod phases;
mod table;

pub use format::{bytes_label, group};

/// How the figures were obtained.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// When the run started (UTC, RFC 3339).
    pub started_at: String,
    /// CPUs available to this process.
    pub cpus: usize,
    /// `/proc/loadavg` at the start and at the end (other work on the machine).
    pub loadavg: (String, String),
    /// Relay batch size (also the raw database phase's).
    pub batch_size: i64,
    /// Partitions of every topic.
    pub partitions: i32,
    /// Replication factor of every topic.
    pub replication: i32,
    /// Broker storage engine (`BENCH_BROKER_STORAGE`).
    pub broker_storage: String,
    /// PostgreSQL settings as read from the server.
    pub postgres: ServerSettings,
    /// Event counts and load duration.
    pub sizes: Sizes,
    /// Distinct aggregates (keys).
    pub aggregates: u64,
    /// Requested payload size, bytes.
    pub payload_bytes: u64,
    /// The payload column (`--payload-kind`).
    pub payload_kind: crate::workload::PayloadKind,
    /// Rows with a `traceparent` each (`--traced`).
    pub traced: bool,
    /// Where the relay exports its spans (`OTEL_EXPORTER_OTLP_ENDPOINT`; `None`: export off).
    pub span_export: Option<String>,
    /// Offered load of the latency phase, events/s.
    pub load_rate: u64,
    /// Writer tasks of the latency phase.
    pub writers: u64,
    /// The relay binary.
    pub relay_binary: String,
    /// Extra relay arguments.
    pub relay_args: Vec<String>,
    /// The relay's librdkafka defaults (also used by the raw producer).
    pub producer_settings: Vec<(String, String)>,
}

/// The headline ratios.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    /// Relay drain rate / raw produce rate (target ≥ 0.6).
    pub relay_over_raw_produce: Option<f64>,
    /// Relay drain rate / naive relay rate (target ≥ 10).
    pub relay_over_naive: Option<f64>,
    /// Relay drain rate / raw database rate.
    pub relay_over_raw_db: Option<f64>,
}

/// What a relay that runs claim, publish and mark one after the other could reach, from the
/// separately measured parts: per event `claim + publish path + mark`.
#[derive(Debug, Clone, Serialize)]
pub struct SerialModel {
    /// Claim share of an event's time.
    pub claim_share: f64,
    /// Publish share.
    pub publish_share: f64,
    /// Mark share.
    pub mark_share: f64,
    /// Events per second predicted.
    pub events_per_s: f64,
}

/// Rates of every round of the throughput phases (`--repeat`), per second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rounds {
    /// Raw produce, msgs/s.
    pub raw_produce: Vec<f64>,
    /// Raw database, rows/s.
    pub raw_db: Vec<f64>,
    /// Relay drain, events/s.
    pub relay_drain: Vec<f64>,
}

/// Every figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Settings.
    pub settings: Settings,
    /// Phase 1.
    pub raw_produce: Option<ProduceFigures>,
    /// Phase 2.
    pub raw_db: Option<DbFigures>,
    /// Phase 3.
    pub relay_drain: Option<DrainFigures>,
    /// Phase 4.
    pub naive: Option<NaiveFigures>,
    /// Phase 5.
    pub latency: Option<LatencyFigures>,
    /// Healthy drain alone, behind poisoned and beside suspect aggregates.
    pub isolation: Option<IsolationFigures>,
    /// Cost per insert of the per-aggregate lock.
    pub insert: Option<InsertFigures>,
    /// What the Debezium copy trigger costs its table's writers.
    pub debezium_copy: Option<crate::debezium_copy::CopyFigures>,
    /// Claim time with a large failure table.
    pub failures: Option<FailuresFigures>,
    /// The large backlog (opt-in).
    pub backlog: Option<BacklogFigures>,
    /// Healthy latency beside a parked aggregate's backlog.
    pub parked: Option<crate::parked::ParkedFigures>,
    /// Payload sizes (opt-in).
    pub sizes: Option<GrowthFigures>,
    /// Topic counts (opt-in).
    pub topics: Option<GrowthFigures>,
    /// The relay's `--transactions` off and on (opt-in).
    pub transactions: Option<TransactionsFigures>,
    /// The cost curve (opt-in).
    pub curve: Option<crate::curve::CurveFigures>,
    /// The latency tail on a fresh and on a just-drained table (opt-in).
    pub tail: Option<crate::tail::TailFigures>,
    /// One relay against three on one backlog (opt-in).
    pub relays: Option<crate::relays::RelaysFigures>,
    /// Debezium and the relay on the same Debezium table (opt-in).
    pub debezium: Option<crate::debezium::DebeziumFigures>,
    /// Every round's rate; the phase figures above are the best round.
    pub rounds: Rounds,
    /// Ratios of phase 3 to phases 1, 2 and 4.
    pub ratios: Ratios,
    /// Serial model from phases 1 and 2.
    pub serial_model: Option<SerialModel>,
    /// Phases that failed.
    pub errors: Vec<String>,
}

impl Report {
    /// Fills in the ratios and the serial model from the phase figures.
    pub fn derive(&mut self) {
        let relay = self.relay_drain.as_ref().map(|d| d.events_per_s);
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        self.ratios = Ratios {
            relay_over_raw_produce: ratio(relay, self.raw_produce.as_ref().map(|p| p.msgs_per_s)),
            relay_over_naive: ratio(relay, self.naive.as_ref().map(|n| n.events_per_s)),
            relay_over_raw_db: ratio(relay, self.raw_db.as_ref().map(|d| d.rows_per_s)),
        };
        self.serial_model = match (&self.raw_produce, &self.raw_db) {
            (Some(p), Some(d)) => {
                let claim = d.claim_seconds / d.rows as f64;
                let mark = d.mark_seconds / d.rows as f64;
                let publish = 1.0 / p.publish_path_msgs_per_s;
                let total = claim + mark + publish;
                Some(SerialModel {
                    claim_share: claim / total,
                    publish_share: publish / total,
                    mark_share: mark / total,
                    events_per_s: 1.0 / total,
                })
            }
            _ => None,
        };
    }
}
