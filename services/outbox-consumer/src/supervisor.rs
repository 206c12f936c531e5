//! Starting partition workers, and restarting the ones that died.
//!
//! A handler's panic is contained by the worker ([`super::worker`]); a panic anywhere else in
//! the worker's task (its own code, storing the offset, the dead-letter path) ends the task.
//! Its partition is still assigned, so nothing else would consume it: the messages queued for
//! it would be dropped and the partition would stop without a word. The fetch loop therefore
//! checks, on every hand-off and every regulate tick, whether the worker of a partition ended
//! without being told to stop ([`WorkerHandle::is_dead`]), and then:
//!
//! 1. logs an error naming the partition (once per dead worker);
//! 2. seeks the partition back to the first offset the dead worker did not finish
//!    ([`WorkerHandle::resume_offset`]: a worker records `offset + 1` only after the message
//!    was applied and its offset stored). librdkafka guarantees that after a seek that waited
//!    for the fetcher, no message fetched for the old position reaches the application, so the
//!    dead worker's queue and overflow buffer are simply discarded: everything in them is
//!    fetched again, in offset order;
//! 3. starts a new worker (a new generation) expecting exactly that offset, and counts the
//!    restart (`consumer_worker_restarts_total`).
//!
//! Until the seek succeeds (it fails while the partition is being revoked, say) the dead
//! handle stays in the registry, every message of the partition is dropped, and the next tick
//! tries again. No offset is stored meanwhile, so no commit passes an unapplied message; a
//! message the dead worker applied but did not record is applied again as an inbox duplicate.
//! A worker that dies on every attempt at a message is restarted every time (each one counted
//! and logged); it holds back only its partition.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Offset;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::handler::Handler;
use super::metrics::ConsumerMetrics;
use super::registry::{WorkerHandle, WorkerRegistry};
use super::runtime::RuntimeContext;
use super::worker::{panic_message, Deps, Worker};

/// How long a restart's seek may wait for the fetcher to take the new position.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// What starting a partition worker takes.
pub(crate) struct Spawner<'a, H> {
    /// Messages queued per partition.
    pub queue_capacity: usize,
    pub deps: &'a Arc<Deps<H>>,
    pub consumer: &'a Arc<StreamConsumer<RuntimeContext>>,
    pub registry: &'a Arc<Mutex<WorkerRegistry>>,
    pub shutdown: &'a CancellationToken,
    pub metrics: &'a ConsumerMetrics,
}

impl<H: Handler> Spawner<'_, H> {
    /// Starts the worker of `topic`/`partition`, whose first message is at `first_offset`.
    pub(crate) fn start(
        &self,
        topic: &str,
        partition: i32,
        first_offset: i64,
        r: &mut WorkerRegistry,
    ) -> WorkerHandle {
        let generation = r.next_generation;
        r.next_generation += 1;
        let (tx, rx) = mpsc::channel(self.queue_capacity.max(1));
        let stop = self.shutdown.child_token();
        let retrying = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicI64::new(-1));
        let worker = Worker {
            deps: self.deps.clone(),
            consumer: self.consumer.clone(),
            registry: self.registry.clone(),
            topic: topic.to_owned(),
            partition,
            generation,
            retrying: retrying.clone(),
            finished: finished.clone(),
        };
        let join = tokio::spawn(worker.run(rx, stop.clone()));
        WorkerHandle {
            tx,
            stop,
            join,
            generation,
            retrying,
            overflow: VecDeque::new(),
            paused: false,
            next_offset: first_offset,
            first_offset,
            finished,
            reported_dead: false,
        }
    }

    /// Restarts the worker of every assigned partition whose worker died.
    pub(crate) fn restart_dead(&self, r: &mut WorkerRegistry) {
        for (topic, partition) in r.dead() {
            self.restart(&topic, partition, r);
        }
    }

    /// Restarts the dead worker of `topic`/`partition` from its first unfinished offset; leaves
    /// the dead handle in place (so the partition's messages keep being dropped) when the seek
    /// fails. Returns whether it restarted.
    pub(crate) fn restart(&self, topic: &str, partition: i32, r: &mut WorkerRegistry) -> bool {
        let key = (topic.to_owned(), partition);
        let Some(dead) = r.workers.get_mut(&key) else {
            return false;
        };
        let from = dead.resume_offset();
        if !dead.reported_dead {
            dead.reported_dead = true;
            tracing::error!(
                kafka.topic = %topic,
                kafka.partition = partition,
                kafka.offset = from,
                discarded = dead.overflow.len(),
                "Partition worker died of a panic outside the handler; restarting it from the first message it did not finish"
            );
        }
        if let Err(e) = self
            .consumer
            .seek(topic, partition, Offset::Offset(from), SEEK_TIMEOUT)
        {
            tracing::debug!(
                kafka.topic = %topic,
                kafka.partition = partition,
                kafka.offset = from,
                error = %e,
                "Could not seek the partition of a dead worker back; trying again"
            );
            return false;
        }
        let Some(dead) = r.workers.remove(&key) else {
            return false;
        };
        let panic = match dead.join.now_or_never() {
            Some(Err(e)) if e.is_panic() => panic_message(&*e.into_panic()),
            _ => "unknown".to_owned(),
        };
        let mut successor = self.start(topic, partition, from, r);
        // librdkafka's paused state of the partition is unchanged; the next regulate resumes it.
        successor.paused = dead.paused;
        r.workers.insert(key, successor);
        self.metrics.worker_restarts.inc();
        tracing::warn!(
            kafka.topic = %topic,
            kafka.partition = partition,
            kafka.offset = from,
            panic = %panic,
            "Restarted a dead partition worker; the messages it had not finished are fetched again"
        );
        true
    }
}
