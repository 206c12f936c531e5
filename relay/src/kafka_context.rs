//! librdkafka client callbacks: broker-level errors are turned into one log line per outage
//! instead of one per reconnect attempt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Client context of the relay's producer; clones share the broker state.
#[derive(Debug, Default, Clone)]
pub struct RelayContext {
    broker_down: Arc<AtomicBool>,
    batch: Arc<std::sync::Mutex<Option<Arc<BatchReports>>>>,
    /// Mirrors `broker_down` (1 while down) for `/metrics`.
    down_gauge: Option<BrokerGauge>,
    /// Its producer was replaced: what it still reports while it is torn down (purged and
    /// flushed, its last events served) is not the broker's state any more.
    retired: Arc<AtomicBool>,
}

/// The `/metrics` gauge of the broker state. Only a leading relay writes it: a standby's idle
/// producer sees an outage but sends nothing, so it would never see the recovery.
#[derive(Debug, Clone)]
pub struct BrokerGauge {
    gauge: IntGauge,
    leading: Arc<AtomicBool>,
}

impl BrokerGauge {
    /// Reports on `gauge`, starting as a standby (0).
    pub fn new(gauge: IntGauge) -> Self {
        gauge.set(0);
        Self {
            gauge,
            leading: Arc::default(),
        }
    }

    fn set(&self, down: bool) {
        if self.leading.load(Ordering::Relaxed) {
            self.gauge.set(i64::from(down));
        }
    }
}

impl RelayContext {
    /// A context that also reports the broker state on `gauge` while leading; `down` carries
    /// the state over from the producer it replaces (a delivery clears it).
    pub fn reporting_on(gauge: Option<BrokerGauge>, down: bool) -> Self {
        Self {
            broker_down: Arc::new(AtomicBool::new(down)),
            down_gauge: gauge,
            ..Self::default()
        }
    }

    /// Leading relays report the broker state; standbys report 0.
    pub fn set_leading(&self, leading: bool) {
        if let Some(g) = &self.down_gauge {
            g.leading.store(leading, Ordering::Relaxed);
            g.gauge.set(i64::from(leading && self.broker_down()));
        }
    }

    /// Stops this context from reporting errors (gauge, `/healthz`, logs): its producer was
    /// replaced, and the new producer's context reports from now on.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    /// True while librdkafka reports the brokers unreachable.
    pub fn broker_down(&self) -> bool {
        self.broker_down.load(Ordering::Relaxed)
    }

    /// Called when a delivery succeeded: the broker is reachable again.
    pub fn mark_broker_up(&self) {
        outbox_kafka::refusal::clear();
        if self.broker_down.swap(false, Ordering::Relaxed) {
            self.set_gauge(false);
            tracing::info!("Kafka broker reachable again");
        }
    }

    fn set_gauge(&self, down: bool) {
        if let Some(g) = &self.down_gauge {
            g.set(down);
        }
    }
}

impl ClientContext for RelayContext {
    /// librdkafka logs every reconnect attempt; those go to debug level. The outage itself is
    /// reported once through [`ClientContext::error`].
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        outbox_kafka::log_librdkafka!(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if self.retired.load(Ordering::Relaxed) {
            tracing::debug!(error = %error, reason, "Kafka client error of a replaced producer");
            return;
        }
        // A refused login or certificate: `/healthz` says so until a delivery gets through.
        outbox_kafka::refusal::note(error.rdkafka_error_code(), reason);
        match outbox_kafka::connectivity(error.rdkafka_error_code()) {
            outbox_kafka::Connectivity::ClusterDown => {
                if !self.broker_down.swap(true, Ordering::Relaxed) {
                    self.set_gauge(true);
                    tracing::warn!(error = %error, reason, "Kafka broker unreachable; librdkafka keeps retrying, in-flight events stay unmarked");
                }
            }
            // One broker (its address in `reason`): not an outage for `outbox_kafka_brokers_down`
            // and `/healthz` while the others serve. librdkafka suppresses repeats.
            outbox_kafka::Connectivity::BrokerLost => {
                tracing::info!(error = %error, reason, "Kafka broker connection failed; librdkafka reconnects");
            }
            _ => tracing::error!(error = %error, reason, "Kafka client error"),
        }
    }
}

/// What a delivery report said about one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// Persisted; the time the report arrived, and the message's offset.
    Acked(chrono::DateTime<chrono::Utc>, i64),
    /// Not persisted (or not known to be).
    Failed(RDKafkaErrorCode),
}

/// The delivery reports of the batch being published: one slot per row, filled by
/// librdkafka's delivery callback, and one wake-up when the last report arrived (instead of a
/// future and a wake-up per message).
#[derive(Debug)]
pub struct BatchReports {
    generation: u32,
    slots: std::sync::Mutex<Vec<Option<Report>>>,
    remaining: std::sync::atomic::AtomicUsize,
    done: tokio::sync::Notify,
    /// A report said a message failed.
    failed: std::sync::atomic::AtomicBool,
}

impl BatchReports {
    /// Slots for `rows` rows; nothing is outstanding until [`BatchReports::expect_one`].
    pub fn new(generation: u32, rows: usize) -> Self {
        Self {
            generation,
            slots: std::sync::Mutex::new(vec![None; rows]),
            // One for the sender, released by [`BatchReports::sent_all`].
            remaining: std::sync::atomic::AtomicUsize::new(1),
            done: tokio::sync::Notify::new(),
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The opaque value of row `index`'s message.
    pub fn opaque(&self, index: usize) -> usize {
        ((self.generation as usize) << 32) | (index & 0xffff_ffff)
    }

    /// A message is about to be handed to librdkafka.
    pub fn expect_one(&self) {
        self.remaining.fetch_add(1, Ordering::AcqRel);
    }

    /// librdkafka refused the message handed over after [`BatchReports::expect_one`].
    pub fn refused_one(&self) {
        self.arrived();
    }

    /// Every message of the batch was handed over.
    pub fn sent_all(&self) {
        self.arrived();
    }

    fn arrived(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.notify_one();
        }
    }

    /// Reports still expected (plus one until [`BatchReports::sent_all`]): falls as the broker
    /// acknowledges, so a waiter can tell a slow batch from one that stopped moving.
    pub fn outstanding(&self) -> usize {
        self.remaining.load(Ordering::Acquire)
    }

    /// True once a report said a message failed.
    pub fn any_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Waits until every expected report arrived.
    pub async fn wait(&self) {
        while self.remaining.load(Ordering::Acquire) != 0 {
            self.done.notified().await;
        }
    }

    /// The reports, in row order (`None` for rows not handed over).
    pub fn take(&self) -> Vec<Option<Report>> {
        std::mem::take(&mut *self.slots.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn fill(&self, opaque: usize, report: Report) {
        if (opaque >> 32) as u32 != self.generation {
            return;
        }
        let index = opaque & 0xffff_ffff;
        let failed = matches!(report, Report::Failed(_));
        {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            match slots.get_mut(index) {
                Some(slot) if slot.is_none() => *slot = Some(report),
                _ => return,
            }
        }
        if failed {
            self.failed.store(true, Ordering::Release);
        }
        self.arrived();
    }
}

impl RelayContext {
    /// Routes the delivery reports to come into `batch`.
    pub fn start_batch(&self, batch: Arc<BatchReports>) {
        *self.batch.lock().unwrap_or_else(|p| p.into_inner()) = Some(batch);
    }
}

impl rdkafka::producer::ProducerContext for RelayContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, opaque: usize) {
        let report = match result {
            Ok(m) => Report::Acked(chrono::Utc::now(), rdkafka::message::Message::offset(m)),
            Err((e, _)) => Report::Failed(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)),
        };
        let batch = self.batch.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(batch) = batch {
            batch.fill(opaque, report);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_producers_context_no_longer_reports_the_broker_state() {
        let gauge = IntGauge::new("brokers_down", "test").unwrap();
        let outage = || KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        let old = RelayContext::reporting_on(Some(BrokerGauge::new(gauge.clone())), false);
        old.set_leading(true);
        let new = RelayContext::reporting_on(old.down_gauge.clone(), old.broker_down());
        old.retire();
        old.error(outage(), "winding down");
        assert_eq!(gauge.get(), 0, "the retired context set the gauge");
        assert!(!old.broker_down());
        new.error(outage(), "down");
        assert_eq!(gauge.get(), 1, "the current context reports");
        new.mark_broker_up();
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn one_brokers_lost_connection_is_not_an_outage() {
        let gauge = IntGauge::new("brokers_down", "test").unwrap();
        let ctx = RelayContext::reporting_on(Some(BrokerGauge::new(gauge.clone())), false);
        ctx.set_leading(true);
        for code in [
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::Resolve,
        ] {
            ctx.error(
                KafkaError::Global(code),
                "127.0.0.1:9093/2: Connect to ipv4#127.0.0.1:9093 failed: Connection refused",
            );
            assert!(!ctx.broker_down(), "{code:?}");
            assert_eq!(gauge.get(), 0, "{code:?}");
        }
        ctx.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "2/2 brokers are down",
        );
        assert!(ctx.broker_down());
        assert_eq!(gauge.get(), 1);
    }
}
