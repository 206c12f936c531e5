//! The one-shot connection check: ask the brokers (the bootstrap list, then every advertised
//! address) for metadata once with the process's own settings, and sort what happened into
//! answered, refused ([`ProbeError::Refused`]) or unreachable.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

use crate::security::KafkaSettings;

/// Why the brokers gave no metadata.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The broker refused the connection: wrong credentials, a certificate that does not
    /// verify against the configured CA or host name, TLS spoken to a plaintext port.
    /// Retrying with the same settings cannot succeed.
    #[error("Kafka refused the connection ({kind}): {reason}")]
    Refused {
        /// `authentication` or `tls`.
        kind: &'static str,
        /// librdkafka's message (it names the mechanism or the certificate problem; never a
        /// secret).
        reason: String,
    },
    /// No broker answered within the deadline (down, not yet up, wrong address).
    #[error("no Kafka broker answered within {0:?}")]
    Unreachable(Duration),
    /// The bootstrap address answered, but a broker's advertised address, where the clients
    /// send their requests, did not (down now, or advertised under an address this process
    /// cannot reach: the broker's `advertised.listeners`).
    #[error("the Kafka bootstrap address answered, but broker {broker} did not at its advertised address {address} (down, or `advertised.listeners` names an address this process cannot reach)")]
    AdvertisedUnreachable {
        /// The broker's id.
        broker: i32,
        /// `host:port` as the cluster's metadata advertises it.
        address: String,
    },
    /// The client could not be created (invalid settings).
    #[error("invalid Kafka client settings")]
    Client(#[from] KafkaError),
}

impl ProbeError {
    /// Whether the process should stop: the settings are wrong, not the broker's state.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            Self::Unreachable(_) | Self::AdvertisedUnreachable { .. }
        )
    }
}

/// Records the first refusal librdkafka reports, whether every broker is down, and the first
/// broker of the cluster's metadata (not a bootstrap address) that failed.
#[derive(Default)]
struct ProbeContext {
    refused: Mutex<Option<(&'static str, String)>>,
    all_down: AtomicBool,
    learned_down: Mutex<Option<(i32, String)>>,
}

impl ClientContext for ProbeContext {
    fn log(&self, _level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        tracing::debug!(librdkafka.facility = fac, "{log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let kind = refusal_kind(error.rdkafka_error_code(), reason);
        tracing::debug!(error = %error, reason, "Kafka connection check");
        if let Some(kind) = kind {
            let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
            refused.get_or_insert((kind, reason.to_owned()));
        } else if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.all_down.store(true, Ordering::Relaxed);
        } else if let Some(learned) = learned_broker(reason) {
            let mut down = self.learned_down.lock().unwrap_or_else(|p| p.into_inner());
            down.get_or_insert(learned);
        }
    }
}

impl ProducerContext for ProbeContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// Whether an error librdkafka reports means "these settings are refused", and which kind: the
/// broker's answer to a failed login, or a TLS handshake that failed for another reason than
/// the connection going away (an untrusted or mismatching certificate, a missing client
/// certificate, TLS spoken to a plaintext port). A connection lost in the middle of a handshake
/// (a broker restarting) is an outage, not a refusal.
pub fn refusal_kind(code: Option<RDKafkaErrorCode>, reason: &str) -> Option<&'static str> {
    const TRANSIENT: [&str; 4] = [
        "Disconnected",
        "onnection reset",
        "timed out",
        "Broken pipe",
    ];
    match code {
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
            Some("authentication")
        }
        Some(RDKafkaErrorCode::SSL) if !TRANSIENT.iter().any(|t| reason.contains(t)) => Some("tls"),
        // The peer's TLS alert (`certificate required`, `unknown ca`, `handshake failure`,
        // ...) arrives as a transport failure when it comes after the handshake (TLS 1.3).
        _ if reason.contains("certificate verify failed")
            || reason.contains("SSL alert number")
            || reason.contains("wrong version number") =>
        {
            Some("tls")
        }
        _ => None,
    }
}

/// Fetches the cluster's metadata from `brokers` with the connection settings among
/// `settings`, for at most `timeout`. Blocking: call it from `spawn_blocking` in async code
/// (or use [`check_connection`]).
///
/// # Errors
/// [`ProbeError::Refused`] as soon as librdkafka reports a refused login or TLS handshake;
/// [`ProbeError::Unreachable`] when every broker is down (connection refused, no such host) or
/// nothing answered in time; [`ProbeError::AdvertisedUnreachable`] when the bootstrap address
/// answered and a broker's advertised address did not.
pub fn check_connection_blocking(
    brokers: &str,
    settings: &KafkaSettings,
    timeout: Duration,
) -> Result<(), ProbeError> {
    check_until(brokers, settings, timeout, &AtomicBool::new(false))
}

/// [`check_connection_blocking`] that gives up ([`ProbeError::Unreachable`]) within half a
/// second of `stop` being set.
///
/// When the bootstrap's answer came only to librdkafka (see [`ask_metadata`]) and the broker it
/// named then failed, the check ends there with [`ProbeError::AdvertisedUnreachable`] for that
/// broker: the other advertised addresses are not asked (the answer never reached the check).
///
/// The metadata names each broker's advertised address, and that is where the clients send
/// everything after the bootstrap: a broker advertised under a name its certificate does not
/// carry, or an address this process cannot reach, would fail only there. So every advertised
/// address that is not among `brokers` is asked for metadata too, each on a connection of its
/// own, all at once, within what is left of `timeout` (at least [`ADVERTISED_MIN`]): a refusal
/// at any of them is the check's (before, it depended on whether a client's first connection
/// there failed before the bootstrap's answer came), and only when none refuses, the first
/// that did not answer ([`ProbeError::AdvertisedUnreachable`]).
pub(crate) fn check_until(
    brokers: &str,
    settings: &KafkaSettings,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<(), ProbeError> {
    let started = Instant::now();
    let advertised: Vec<(i32, String)> = ask_metadata(brokers, settings, timeout, stop)?
        .into_iter()
        .filter(|(_, a)| !bootstrap_names(brokers, a))
        .collect();
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(ADVERTISED_MIN);
    let answers: Vec<Result<Vec<(i32, String)>, ProbeError>> = std::thread::scope(|scope| {
        let probes: Vec<_> = advertised
            .iter()
            .map(|(_, address)| scope.spawn(move || ask_metadata(address, settings, left, stop)))
            .collect();
        probes
            .into_iter()
            .map(|p| {
                p.join()
                    .unwrap_or(Err(ProbeError::Client(KafkaError::Canceled)))
            })
            .collect()
    });
    let mut unreachable = None;
    for ((broker, address), answer) in advertised.into_iter().zip(answers) {
        match answer {
            Ok(_) => {}
            Err(ProbeError::Refused { kind, reason }) => {
                return Err(ProbeError::Refused {
                    kind,
                    reason: format!(
                        "broker {broker} at its advertised address {address}: {reason}"
                    ),
                })
            }
            Err(ProbeError::Unreachable(_) | ProbeError::AdvertisedUnreachable { .. }) => {
                unreachable.get_or_insert(ProbeError::AdvertisedUnreachable { broker, address });
            }
            Err(e) => return Err(e),
        }
    }
    unreachable.map_or(Ok(()), Err)
}

/// The least time the advertised addresses get, whatever the bootstrap took.
const ADVERTISED_MIN: Duration = Duration::from_secs(5);

/// Whether `address` (`host:port`) is one of the bootstrap servers `brokers` (comma separated,
/// each `host:port`, optionally with a `PROTOCOL://` prefix).
fn bootstrap_names(brokers: &str, address: &str) -> bool {
    brokers.split(',').any(|b| {
        let b = b.trim();
        let b = b.split_once("://").map_or(b, |(_, rest)| rest);
        b.eq_ignore_ascii_case(address)
    })
}

/// The broker an error of librdkafka's is about, when it is one the client learned from the
/// cluster's metadata: its id and advertised `host:port`. librdkafka names a broker
/// `[protocol://]host:port/<id>` once metadata named it, `.../bootstrap` before, and starts
/// its errors with that name.
fn learned_broker(reason: &str) -> Option<(i32, String)> {
    let (name, _) = reason.split_once(": ")?;
    let (address, id) = name.rsplit_once('/')?;
    let id = id.parse().ok()?;
    let address = address.split_once("://").map_or(address, |(_, rest)| rest);
    // librdkafka writes `host:port` without brackets, an IPv6 host too (`::1:9092`).
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((id, broker_address(host, port.parse().ok()?)))
}

/// Why [`ask_metadata`] got no answer: the broker learned from the metadata librdkafka alone
/// received, if one failed and it is not one of the bootstrap addresses `brokers` (a broker
/// that answered there and went down is down, not advertised out of reach); else nothing
/// answered.
fn unanswered(brokers: &str, learned: Option<(i32, String)>, timeout: Duration) -> ProbeError {
    match learned {
        Some((broker, address)) if !bootstrap_names(brokers, &address) => {
            ProbeError::AdvertisedUnreachable { broker, address }
        }
        _ => ProbeError::Unreachable(timeout),
    }
}

/// `host:port` as a bootstrap server (an IPv6 host in brackets).
fn broker_address(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Asks `brokers` for the cluster's metadata with a client of its own; on an answer, each
/// broker's id and advertised address.
///
/// It asks in steps of half a second (a refusal is reported between two requests, and `stop`
/// is looked at), so an answer can come after its request timed out: librdkafka takes it all
/// the same (its own metadata request on connecting), learns the advertised addresses and
/// sends the next request there, no longer to the bootstrap address. When nothing answered
/// but such a learned broker failed, the bootstrap answered and that broker did not:
/// [`ProbeError::AdvertisedUnreachable`], not [`ProbeError::Unreachable`] (before, a
/// handshake slower than a step made an out-of-reach advertised address look like no broker).
fn ask_metadata(
    brokers: &str,
    settings: &KafkaSettings,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<Vec<(i32, String)>, ProbeError> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers);
    cfg.set("enable.metrics.push", "false");
    let mut client_id = "outbox";
    for (k, v) in crate::connection_settings(settings) {
        if k == "client.id" {
            client_id = v;
        }
        cfg.set(k, v);
    }
    // Told apart from the process's own clients in the broker's logs and quotas.
    cfg.set("client.id", format!("{client_id}-check"));
    let producer: BaseProducer<ProbeContext> = cfg.create_with_context(ProbeContext::default())?;
    let deadline = Instant::now() + timeout;
    loop {
        let step =
            Duration::from_millis(500).min(deadline.saturating_duration_since(Instant::now()));
        let answered = producer.client().fetch_metadata(None, step).ok().map(|m| {
            m.brokers()
                .iter()
                .map(|b| (b.id(), broker_address(b.host(), b.port())))
                .collect()
        });
        // Error events are served by poll.
        producer.poll(Duration::ZERO);
        if let Some((kind, reason)) = producer
            .context()
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return Err(ProbeError::Refused { kind, reason });
        }
        if let Some(advertised) = answered {
            return Ok(advertised);
        }
        // Every broker was tried and none got as far as TLS or SASL (a refusal would have been
        // reported first): down, not refusing.
        let all_down = producer.context().all_down.load(Ordering::Relaxed);
        if stop.load(Ordering::Relaxed) {
            return Err(ProbeError::Unreachable(timeout));
        }
        if all_down || Instant::now() >= deadline {
            let learned = producer
                .context()
                .learned_down
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            return Err(unanswered(brokers, learned, timeout));
        }
    }
}

/// [`check_connection_blocking`] on a blocking thread.
///
/// # Errors
/// See [`check_connection_blocking`].
pub async fn check_connection(
    brokers: &str,
    settings: &KafkaSettings,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let brokers = brokers.to_owned();
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || check_connection_blocking(&brokers, &settings, timeout))
        .await
        .map_err(|_| ProbeError::Client(KafkaError::Canceled))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_addresses_are_compared_with_the_bootstrap_list() {
        let list = "SASL_SSL://Kafka-1.example:9093, kafka-2.example:9093,[::1]:9092";
        assert!(bootstrap_names(list, "kafka-1.example:9093"));
        assert!(bootstrap_names(list, "kafka-2.example:9093"));
        assert!(bootstrap_names(list, &broker_address("::1", 9092)));
        assert!(!bootstrap_names(list, "kafka-1.example:9092"));
        assert!(!bootstrap_names(list, "10.0.0.7:9093"));
        assert_eq!(broker_address("10.0.0.7", 9093), "10.0.0.7:9093");
    }

    #[test]
    fn errors_of_brokers_learned_from_metadata_name_the_broker() {
        assert_eq!(
            learned_broker(
                "sasl_ssl://localhost:41234/1: Connect to ipv4#127.0.0.1:41234 failed: \
                 Connection refused (after 0ms in state CONNECT)"
            ),
            Some((1, "localhost:41234".to_owned()))
        );
        assert_eq!(
            learned_broker("kafka-2.example:9092/1002: Disconnected"),
            Some((1002, "kafka-2.example:9092".to_owned()))
        );
        assert_eq!(
            learned_broker(
                "ssl://localhost:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"
            ),
            None,
            "a bootstrap address is not a learned broker"
        );
        assert_eq!(learned_broker("1/1 brokers are down"), None);
        assert_eq!(
            learned_broker("::1:9092/2: Connect to ipv6#[::1]:9092 failed: Connection refused"),
            Some((2, "[::1]:9092".to_owned())),
            "an IPv6 host, written without brackets, as the metadata's addresses are compared"
        );
    }

    #[test]
    fn a_learned_broker_that_failed_is_advertised_out_of_reach_unless_it_is_a_bootstrap_address() {
        let timeout = Duration::from_secs(30);
        assert!(matches!(
            unanswered("localhost:9093", Some((1, "localhost:9094".into())), timeout),
            ProbeError::AdvertisedUnreachable { broker: 1, ref address } if address == "localhost:9094"
        ));
        assert!(
            matches!(
                unanswered(
                    "SASL_SSL://localhost:9093",
                    Some((1, "localhost:9093".into())),
                    timeout
                ),
                ProbeError::Unreachable(_)
            ),
            "the bootstrap address itself: the broker went down after answering"
        );
        assert!(matches!(
            unanswered("localhost:9093", None, timeout),
            ProbeError::Unreachable(_)
        ));
    }

    #[test]
    fn an_advertised_address_out_of_reach_is_not_fatal_a_refusal_there_is() {
        let e = ProbeError::AdvertisedUnreachable {
            broker: 1,
            address: "kafka:9092".into(),
        };
        assert!(!e.is_fatal());
        assert!(e.to_string().contains("kafka:9092"), "{e}");
        assert!(ProbeError::Refused {
            kind: "tls",
            reason: "broker 1 at its advertised address kafka:9092: certificate verify failed"
                .into(),
        }
        .is_fatal());
    }

    #[test]
    fn refusals_are_told_from_outages() {
        assert_eq!(
            refusal_kind(
                Some(RDKafkaErrorCode::Authentication),
                "SASL authentication error"
            ),
            Some("authentication")
        );
        assert_eq!(
            refusal_kind(
                Some(RDKafkaErrorCode::SSL),
                "SSL handshake failed: certificate verify failed"
            ),
            Some("tls")
        );
        assert_eq!(
            refusal_kind(
                Some(RDKafkaErrorCode::BrokerTransportFailure),
                "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
            ),
            None
        );
        assert_eq!(
            refusal_kind(
                Some(RDKafkaErrorCode::BrokerTransportFailure),
                "ssl://localhost:1/bootstrap: Receive failed: error:0A00045C:SSL routines::tlsv13 \
                 alert certificate required: SSL alert number 116"
            ),
            Some("tls"),
            "a broker wanting a client certificate we did not send"
        );
        assert_eq!(
            refusal_kind(
                Some(RDKafkaErrorCode::AllBrokersDown),
                "1/1 brokers are down"
            ),
            None
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_not_refused() {
        let e = check_connection(
            "127.0.0.1:1",
            &KafkaSettings::default(),
            Duration::from_secs(30),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ProbeError::Unreachable(_)), "{e:?}");
        assert!(!e.is_fatal());
    }
}
