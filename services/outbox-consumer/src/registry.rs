//! The partition workers of one runtime and the fetch loop's bookkeeping of each partition
//! (queue, overflow buffer, paused or not), shared by the fetch loop (which starts workers) and
//! the rebalance callback (which stops them). [`WorkerRegistry::is_current`] decides whether a
//! worker may still store offsets: not after its partition was revoked, still after a shutdown
//! request (the partition is ours until the consumer closes).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::event::RawMessage;

/// A running partition worker, and the fetch loop's bookkeeping of its partition.
pub(crate) struct WorkerHandle {
    pub(crate) tx: mpsc::Sender<RawMessage>,
    pub(crate) stop: CancellationToken,
    pub(crate) join: JoinHandle<()>,
    pub(crate) generation: u64,
    /// Set by the worker while it retries a message.
    pub(crate) retrying: Arc<AtomicBool>,
    /// Fetched messages waiting for room in the queue, in offset order.
    pub(crate) overflow: VecDeque<RawMessage>,
    /// Whether the fetch loop paused the partition.
    pub(crate) paused: bool,
    /// The offset after the last message handed to this worker (or its overflow buffer).
    pub(crate) next_offset: i64,
    /// The offset of the first message handed to this worker.
    pub(crate) first_offset: i64,
    /// Set by the worker after each message it finished (and stored): the offset after it;
    /// negative until the first.
    pub(crate) finished: Arc<AtomicI64>,
    /// Whether the fetch loop already reported this worker dead.
    pub(crate) reported_dead: bool,
}

impl WorkerHandle {
    /// Whether the worker's task ended without being told to stop. A worker only returns when
    /// its stop token is cancelled (revoke, shutdown) or its queue closes (its handle is
    /// dropped), so a finished task of a handle still in the registry died of a panic outside
    /// the contained handler.
    pub(crate) fn is_dead(&self) -> bool {
        self.join.is_finished() && !self.stop.is_cancelled()
    }

    /// The first offset this worker did not finish: where its successor has to start. Every
    /// offset before it was applied (or dead-lettered) and stored; none after it was stored.
    pub(crate) fn resume_offset(&self) -> i64 {
        let finished = self.finished.load(Ordering::Acquire);
        if finished < 0 {
            self.first_offset
        } else {
            finished
        }
    }
}

/// The partition workers of one runtime, shared by the fetch loop (which starts them) and the
/// rebalance callback (which stops them).
#[derive(Default)]
pub(crate) struct WorkerRegistry {
    pub(crate) workers: HashMap<(String, i32), WorkerHandle>,
    /// Workers of revoked partitions finishing their event in hand.
    retired: Vec<JoinHandle<()>>,
    /// Generations of workers told to stop by the shutdown: the partitions are still assigned,
    /// so what they finish still has its offset stored.
    draining: HashMap<(String, i32), u64>,
    pub(crate) next_generation: u64,
}

impl WorkerRegistry {
    /// Whether the worker of `generation` still owns the partition (it may store offsets).
    pub fn is_current(&self, topic: &str, partition: i32, generation: u64) -> bool {
        let key = (topic.to_owned(), partition);
        self.workers
            .get(&key)
            .is_some_and(|w| w.generation == generation)
            || self.draining.get(&key) == Some(&generation)
    }

    /// Stops the workers of the given (revoked) partitions after their event in hand; their
    /// later finishes store no offset. Returns the partitions that were paused, to resume.
    pub(crate) fn retire(&mut self, partitions: &[(String, i32)]) -> Vec<(String, i32)> {
        let mut paused = vec![];
        for p in partitions {
            self.draining.remove(p);
            if let Some(w) = self.workers.remove(p) {
                w.stop.cancel();
                self.retired.push(w.join);
                if w.paused {
                    paused.push(p.clone());
                }
            }
        }
        self.retired.retain(|h| !h.is_finished());
        paused
    }

    /// Shutdown: stops every worker after its event in hand, keeping its right to store the
    /// offsets it finishes; returns their tasks.
    pub(crate) fn retire_all(&mut self) -> Vec<JoinHandle<()>> {
        for (key, w) in self.workers.drain() {
            w.stop.cancel();
            self.draining.insert(key, w.generation);
            self.retired.push(w.join);
        }
        std::mem::take(&mut self.retired)
    }

    /// The assigned partitions whose worker died ([`WorkerHandle::is_dead`]).
    pub(crate) fn dead(&self) -> Vec<(String, i32)> {
        self.workers
            .iter()
            .filter(|(_, w)| w.is_dead())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Partitions currently paused by the fetch loop.
    pub(crate) fn paused_count(&self) -> usize {
        self.workers.values().filter(|w| w.paused).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(registry: &mut WorkerRegistry, topic: &str, partition: i32) -> CancellationToken {
        let (tx, _rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let s = stop.clone();
        let generation = registry.next_generation;
        registry.next_generation += 1;
        registry.workers.insert(
            (topic.to_owned(), partition),
            WorkerHandle {
                tx,
                stop: stop.clone(),
                join: tokio::spawn(async move { s.cancelled().await }),
                generation,
                retrying: Arc::default(),
                overflow: VecDeque::new(),
                paused: false,
                next_offset: 0,
                first_offset: 0,
                finished: Arc::new(AtomicI64::new(-1)),
                reported_dead: false,
            },
        );
        stop
    }

    #[tokio::test]
    async fn a_worker_that_ended_without_being_stopped_is_dead_and_resumes_at_its_first_unfinished_offset(
    ) {
        let mut r = WorkerRegistry::default();
        let _stop = handle(&mut r, "t", 0);
        let key = ("t".to_owned(), 0);
        let w = r.workers.get_mut(&key).unwrap();
        w.first_offset = 7;
        assert_eq!(
            w.resume_offset(),
            7,
            "nothing finished: from the first message"
        );
        w.finished.store(9, Ordering::Release);
        assert_eq!(w.resume_offset(), 9, "after the last finished message");
        assert!(r.dead().is_empty(), "still running");
        let w = r.workers.get_mut(&key).unwrap();
        w.join = tokio::spawn(async { panic!("worker bug") });
        while !w.join.is_finished() {
            tokio::task::yield_now().await;
        }
        assert_eq!(r.dead(), std::slice::from_ref(&key));
        // Told to stop (the shutdown cancels every worker): ended, but not dead.
        r.workers[&key].stop.cancel();
        assert!(r.dead().is_empty());
    }

    #[tokio::test]
    async fn a_revoked_partition_stops_its_worker_and_its_offsets_are_no_longer_stored() {
        let mut r = WorkerRegistry::default();
        let stop0 = handle(&mut r, "t", 0);
        let stop1 = handle(&mut r, "t", 1);
        assert!(r.is_current("t", 0, 0) && r.is_current("t", 1, 1));
        r.retire(&[("t".to_owned(), 0)]);
        assert!(
            stop0.is_cancelled(),
            "the revoked partition's worker is told to stop"
        );
        assert!(!stop1.is_cancelled(), "the other partitions go on");
        assert!(
            !r.is_current("t", 0, 0),
            "a late finish must not store an offset"
        );
        // Assigned again: a new worker with a new generation; the old one still may not store.
        let _again = handle(&mut r, "t", 0);
        assert!(!r.is_current("t", 0, 0) && r.is_current("t", 0, 2));
        let all = r.retire_all();
        assert!(stop1.is_cancelled());
        assert!(r.workers.is_empty());
        futures::future::join_all(all).await;
    }

    #[tokio::test]
    async fn workers_stopped_by_the_shutdown_still_store_what_they_finish() {
        let mut r = WorkerRegistry::default();
        let stop = handle(&mut r, "t", 0);
        let all = r.retire_all();
        assert!(stop.is_cancelled(), "told to stop after the event in hand");
        assert!(
            r.is_current("t", 0, 0),
            "the partition is still ours until the consumer closes: its finish is stored"
        );
        assert!(!r.is_current("t", 0, 1), "only that worker");
        // A revoke during the drain takes the right away again.
        r.retire(&[("t".to_owned(), 0)]);
        assert!(!r.is_current("t", 0, 0));
        futures::future::join_all(all).await;
    }
}
