//! The start-up policy of a long-running process: a refusal stops it, an unreachable broker does
//! not (the clients keep retrying), and the check goes on in the background until a broker
//! answers, so a refusal the first time one does still stops the process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::KafkaError;

use super::check::{check_until, ProbeError};
use crate::security::KafkaSettings;

/// Runs [`check_connection`] and decides for a long-running process: a refusal is returned (the
/// process should stop and say why), an unreachable broker is logged and let through (the
/// clients keep retrying, as during any outage), with the check going on in the background
/// until a broker answers: a process that has never reached a broker still stops on the first
/// refusal ([`StartCheck::stop_on_refusal`]), however late the broker comes up. `shutdown`
/// ends the check at once (a broker that takes the connection and never answers holds it for
/// about 10 s): the process is stopping, nothing is left to check.
///
/// # Errors
/// [`ProbeError`] when [`ProbeError::is_fatal`].
///
/// [`check_connection`]: super::check::check_connection
pub async fn check_at_start(
    brokers: &str,
    settings: &KafkaSettings,
    timeout: Duration,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<StartCheck, ProbeError> {
    let Some(checked) = check_unless(brokers, settings, timeout, shutdown).await else {
        // Stopping before the check ended: nothing to check any more.
        return Ok(StartCheck { pending: None });
    };
    match checked {
        Ok(()) => Ok(StartCheck { pending: None }),
        Err(e) if e.is_fatal() => Err(e),
        Err(e @ ProbeError::AdvertisedUnreachable { .. }) => {
            // A broker answered: the clients take it from here, and report a broker they
            // cannot reach as any outage.
            tracing::warn!(error = %e, "Kafka broker unreachable at its advertised address at start-up; carrying on");
            Ok(StartCheck { pending: None })
        }
        Err(e) => {
            tracing::warn!(error = %e, "Kafka not reachable at start-up; carrying on, the clients keep retrying");
            Ok(StartCheck {
                pending: Some((brokers.to_owned(), settings.clone(), timeout)),
            })
        }
    }
}

/// What [`check_at_start`] leaves when no broker answered yet.
#[derive(Debug)]
#[must_use = "a process that never reached a broker stops on a refusal only through stop_on_refusal"]
pub struct StartCheck {
    /// Brokers, settings and the time one check may take, while no broker answered.
    pending: Option<(String, KafkaSettings, Duration)>,
}

impl StartCheck {
    /// Goes on checking in the background while no broker has answered (every second at first,
    /// backing off to every 30 s), until one answers, or refuses: then it logs why, keeps the
    /// refusal and cancels `shutdown`, so the process stops as it would have at start-up.
    pub fn stop_on_refusal(self, shutdown: tokio_util::sync::CancellationToken) -> RefusalWatch {
        let refused = Arc::new(Mutex::new(None));
        let Some((brokers, settings, timeout)) = self.pending else {
            return RefusalWatch { refused };
        };
        let kept = refused.clone();
        tokio::spawn(async move {
            let mut wait = Duration::from_secs(1);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(Duration::from_secs(30));
                let Some(checked) = check_unless(&brokers, &settings, timeout, &shutdown).await
                else {
                    return;
                };
                match checked {
                    Ok(()) => {
                        tracing::info!("Kafka broker reachable");
                        return;
                    }
                    Err(e @ ProbeError::AdvertisedUnreachable { .. }) => {
                        tracing::warn!(error = %e, "Kafka broker reachable at the bootstrap address only");
                        return;
                    }
                    Err(e) if e.is_fatal() => {
                        tracing::error!(error = %e, "Kafka refused this process's settings the first time a broker answered; stopping");
                        *kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        shutdown.cancel();
                        return;
                    }
                    Err(_) => {}
                }
            }
        });
        RefusalWatch { refused }
    }
}

/// [`check_connection`] unless `shutdown` comes first (`None`). The check runs on a blocking
/// thread of its own, told to stop when this future ends or is dropped: a runtime waits for
/// its blocking threads as it shuts down, and a check can take `timeout`.
///
/// [`check_connection`]: super::check::check_connection
async fn check_unless(
    brokers: &str,
    settings: &KafkaSettings,
    timeout: Duration,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Option<Result<(), ProbeError>> {
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let check = {
        let (brokers, settings, stop) = (brokers.to_owned(), settings.clone(), stop.0.clone());
        tokio::task::spawn_blocking(move || check_until(&brokers, &settings, timeout, &stop))
    };
    tokio::select! {
        () = shutdown.cancelled() => None,
        checked = check => Some(checked.unwrap_or(Err(ProbeError::Client(KafkaError::Canceled)))),
    }
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The refusal [`StartCheck::stop_on_refusal`] stopped the process for, if it did.
#[derive(Debug, Clone)]
pub struct RefusalWatch {
    refused: Arc<Mutex<Option<ProbeError>>>,
}

impl RefusalWatch {
    /// The refusal, once, as the error the process should exit with.
    ///
    /// # Errors
    /// The refusal [`StartCheck::stop_on_refusal`] stopped the process for.
    pub fn check(&self) -> Result<(), ProbeError> {
        match self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// How long [`check_at_start`] waits for an answer by default: librdkafka's own
/// `socket.connection.setup.timeout.ms` (30 s), so a handshake that is slow to fail (a loaded
/// TLS terminator in front of the broker) still gets its verdict before the process carries
/// on. A broker that refuses the TCP connection ends the check at once (every broker down),
/// whatever this is; the check then goes on in the background ([`StartCheck`]).
pub const START_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
