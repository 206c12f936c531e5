//! A producer whose events (delivery reports, errors, logs) are served by a thread of its own,
//! like rdkafka's `ThreadedProducer`, without its idle cost.
//!
//! `ThreadedProducer`'s thread calls `BaseProducer::poll` with 100 ms over and over. That poll
//! waits in steps of whole milliseconds (rdkafka 0.39 truncates what is left of its deadline to
//! milliseconds), so the last step of every call, under 1 ms, is a wait of 0 ms repeated until
//! the deadline passes: about 1 ms of busy looping per 100 ms, ~1 % of a core per producer, all
//! the time, with nothing to send (seen with `perf` on an idle relay: `clock_gettime` from
//! `Deadline::elapsed`, 90 ms of CPU per 10 s per producer).
//!
//! Here the thread sleeps on a socket that librdkafka writes to when an event arrives on the
//! producer's queue (`rd_kafka_queue_io_event_enable`: when an event lands in the empty queue),
//! serves until the queue is empty without waiting, and sleeps again, for at most a second. The drop wakes the thread through
//! the same socket, joins it and destroys the producer, as `ThreadedProducer`'s drop does.

use std::io::{ErrorKind, Read, Write};
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

/// Longest the serving thread sleeps without a wake-up (one wake-up a second when idle).
const BACKSTOP: Duration = Duration::from_secs(1);

/// A [`BaseProducer`] (reached through `Deref`) whose events a thread of its own serves.
pub struct PolledProducer<C: ProducerContext + 'static> {
    /// `None` once dropped.
    producer: Option<Arc<BaseProducer<C>>>,
    stop: Arc<AtomicBool>,
    /// The end librdkafka writes a byte to when an event arrives (non-blocking).
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

/// The producer's main queue (where its events go), as a handle of our own.
struct MainQueue(*mut rdsys::rd_kafka_queue_t);

// SAFETY: librdkafka queues are thread-safe; the handle is only a reference to one.
unsafe impl Send for MainQueue {}

impl MainQueue {
    fn of<C: ProducerContext>(producer: &BaseProducer<C>) -> Self {
        // SAFETY: the client pointer is valid while `producer` lives; the handle is released in
        // `drop`, before the serving thread lets go of its share of the producer.
        Self(unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) })
    }

    fn len(&self) -> usize {
        // SAFETY: a valid queue handle.
        unsafe { rdsys::rd_kafka_queue_length(self.0) }
    }
}

impl Drop for MainQueue {
    fn drop(&mut self) {
        // SAFETY: a valid queue handle, released once; fd -1 turns the wake-ups off first, so
        // librdkafka never writes to the socket after this.
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.0, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.0);
        }
    }
}

impl<C: ProducerContext + 'static> PolledProducer<C> {
    /// Creates the producer and its serving thread (named `name`).
    ///
    /// # Errors
    /// Invalid librdkafka settings; the thread or its socket could not be made.
    pub fn create(config: &ClientConfig, context: C, name: &str) -> KafkaResult<Self> {
        let producer = Arc::new(BaseProducer::from_config_and_context(config, context)?);
        let system = |e: std::io::Error| KafkaError::ClientCreation(e.to_string());
        let (mut sleeper, wake) = UnixStream::pair().map_err(system)?;
        sleeper.set_read_timeout(Some(BACKSTOP)).map_err(system)?;
        // librdkafka writes with the queue's lock held: it must never block.
        wake.set_nonblocking(true).map_err(system)?;
        let queue = MainQueue::of(&producer);
        // SAFETY: a valid queue handle; the socket outlives the wake-ups (turned off in
        // `MainQueue::drop`, and `wake` is closed only after the thread is joined).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(
                queue.0,
                wake.as_raw_fd(),
                b"e".as_ptr().cast(),
                1,
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (served, stopped) = (producer.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut bytes = [0u8; 64];
                loop {
                    // Serve until the queue is empty (one event per zero-wait poll): librdkafka
                    // writes only when an event lands in an empty queue, after a poll.
                    while queue.len() > 0 {
                        served.poll(Duration::ZERO);
                    }
                    if stopped.load(Ordering::Acquire) {
                        break;
                    }
                    match sleeper.read(&mut bytes) {
                        Ok(_) => {}
                        // The backstop (a wake-up missed for any reason costs at most this),
                        // or a signal.
                        Err(e)
                            if matches!(
                                e.kind(),
                                ErrorKind::WouldBlock
                                    | ErrorKind::TimedOut
                                    | ErrorKind::Interrupted
                            ) => {}
                        Err(_) => {
                            // The socket broke (never expected): fall back to timed polls.
                            while !stopped.load(Ordering::Acquire) {
                                served.poll(Duration::from_secs(1));
                            }
                            break;
                        }
                    }
                }
                drop(queue);
                drop(served);
            })
            .map_err(system)?;
        Ok(Self {
            producer: Some(producer),
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// The producer, to move into another thread (e.g. for a blocking metadata request).
    pub fn shared(&self) -> Arc<BaseProducer<C>> {
        self.producer.clone().expect("not dropped")
    }
}

impl<C: ProducerContext + 'static> Deref for PolledProducer<C> {
    type Target = BaseProducer<C>;

    fn deref(&self) -> &BaseProducer<C> {
        self.producer.as_deref().expect("not dropped")
    }
}

impl<C: ProducerContext + 'static> Drop for PolledProducer<C> {
    /// Stops and joins the thread (it wakes at once), then drops the producer: unless another
    /// share of it is still out ([`PolledProducer::shared`]), librdkafka purges what is queued
    /// and destroys the client here, as with `ThreadedProducer`.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = (&self.wake).write(b"s");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.producer.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::client::ClientContext;
    use rdkafka::message::DeliveryResult;
    use rdkafka::producer::BaseRecord;
    use std::sync::mpsc;

    /// CPU time of one thread of this process, from its `schedstat` (nanoseconds on a CPU).
    fn thread_cpu(name: &str) -> Option<Duration> {
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            let dir = task.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if comm.trim_end() == name {
                let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
                let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
                return Some(Duration::from_nanos(ns));
            }
        }
        None
    }

    /// Nothing listens there.
    fn nowhere() -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", "127.0.0.1:9");
        cfg
    }

    #[test]
    fn an_idle_producer_does_not_spin_and_its_thread_ends_with_the_drop() {
        let p = PolledProducer::create(
            &nowhere(),
            rdkafka::producer::DefaultProducerContext,
            "idle-producer",
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let before = thread_cpu("idle-producer").expect("the serving thread runs");
        std::thread::sleep(Duration::from_secs(3));
        let used = thread_cpu("idle-producer").unwrap() - before;
        // ThreadedProducer's thread (polls of 100 ms) used 25.6 ms in 3 s here; this one wakes
        // only for librdkafka's events (its connection attempts' logs and errors).
        assert!(
            used < Duration::from_millis(10),
            "idle thread used {used:?} in 3 s"
        );
        drop(p);
        assert_eq!(
            thread_cpu("idle-producer"),
            None,
            "the thread outlived the drop"
        );
    }

    /// Sends each delivery report's error (or `None`) down a channel.
    struct Reports(std::sync::Mutex<mpsc::Sender<Option<String>>>);

    impl ClientContext for Reports {}

    impl ProducerContext for Reports {
        type DeliveryOpaque = ();

        fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
            let error = result.as_ref().err().map(|(e, _)| e.to_string());
            let _ = self.0.lock().unwrap().send(error);
        }
    }

    #[test]
    fn delivery_reports_reach_the_context_without_a_poll_by_the_caller() {
        let (tx, rx) = mpsc::channel();
        let mut cfg = nowhere();
        cfg.set("message.timeout.ms", "300");
        let p = PolledProducer::create(&cfg, Reports(tx.into()), "report-producer").unwrap();
        for _ in 0..3 {
            p.send(BaseRecord::<(), [u8]>::to("t").payload(b"x"))
                .map_err(|(e, _)| e)
                .unwrap();
        }
        for n in 0..3 {
            let report = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("delivery report {n} never came"));
            assert!(
                report.is_some(),
                "nothing listens, yet delivered: {report:?}"
            );
        }
    }
}
