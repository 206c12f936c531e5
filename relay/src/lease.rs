//! Keeping the relay lease while this instance is the active publisher.
//!
//! A background task renews the lease every third of its time-to-live. The relay loop asks
//! [`LeaseGuard::is_valid`] before each claim (and each publisher before each commit of a
//! Kafka transaction, [`LeaseGuard::check`]): the lease is trusted locally only until the
//! time-to-live (minus a margin) has passed since the last successful renewal started, so a
//! relay cut off from the database stops claiming before a standby can take over. Marking is
//! fenced by the epoch in the database as well (`Store::mark_published`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::outage::Outage;
use crate::store::{LeaseToken, Store};

/// The lease as held by this instance; renewed in the background until dropped or stopped.
#[derive(Debug)]
pub struct LeaseGuard {
    token: LeaseToken,
    ttl: Duration,
    valid_until: Arc<Mutex<Instant>>,
    lost: CancellationToken,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

fn trusted_for(ttl: Duration) -> Duration {
    ttl.mul_f64(0.8)
}

impl LeaseGuard {
    /// Starts renewing `token`, acquired at `acquired_at` (the instant the acquiring
    /// statement was sent).
    pub fn start(store: Store, token: LeaseToken, ttl: Duration, acquired_at: Instant) -> Self {
        let valid_until = Arc::new(Mutex::new(acquired_at + trusted_for(ttl)));
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_loop(
            store,
            token.clone(),
            ttl,
            valid_until.clone(),
            lost.clone(),
            stop.clone(),
        ));
        Self {
            token,
            ttl,
            valid_until,
            lost,
            stop,
            task: Some(task),
        }
    }

    /// The lease token (name, holder, epoch).
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }

    /// The lease's time-to-live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lease was renewed by a statement sent at `sent` (outside the background renewal:
    /// a producer's initialisation renews it under its lock, see [`crate::batch`]).
    pub fn renewed(&self, sent: Instant) {
        extend(&self.valid_until, sent + trusted_for(self.ttl));
    }

    /// True while the lease is known to be held.
    pub fn is_valid(&self) -> bool {
        self.check().is_valid()
    }

    /// [`LeaseGuard::is_valid`] as a handle of its own: each publisher of the lease asks it
    /// before it commits a Kafka transaction.
    pub fn check(&self) -> LeaseCheck {
        LeaseCheck {
            valid_until: self.valid_until.clone(),
            lost: self.lost.clone(),
        }
    }

    /// Resolves when the database says the lease changed hands.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Stops renewing.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Whether a [`LeaseGuard`]'s lease is still known to be held ([`LeaseGuard::check`]).
#[derive(Debug, Clone)]
pub struct LeaseCheck {
    valid_until: Arc<Mutex<Instant>>,
    lost: CancellationToken,
}

impl LeaseCheck {
    /// True while the lease is known to be held.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < *self.valid_until.lock().unwrap()
    }
}

/// Moves `valid_until` to `to` if that is later.
fn extend(valid_until: &Mutex<Instant>, to: Instant) {
    let mut v = valid_until.lock().unwrap();
    *v = (*v).max(to);
}

async fn renew_loop(
    store: Store,
    token: LeaseToken,
    ttl: Duration,
    valid_until: Arc<Mutex<Instant>>,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let every = ttl / 3;
    let mut outage = Outage::new("lease renewal");
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let sent = Instant::now();
        match store.renew_lease_within(&token, ttl, every / 2).await {
            // This relay's own producer initialisation holds the row; it renews the lease
            // itself when it ends.
            Ok(None) => outage.recovered(),
            Ok(Some(true)) => {
                outage.recovered();
                // Never backwards: a renewal that waited behind this relay's own hold of the
                // row (a producer's initialisation) was sent before the hold's own renewal.
                extend(&valid_until, sent + trusted_for(ttl));
            }
            Ok(Some(false)) => {
                tracing::warn!(lease.name = %token.name, lease.epoch = token.epoch, "Relay lease taken over by another instance");
                lost.cancel();
                return;
            }
            Err(e) => outage.failed(&e),
        }
    }
}
