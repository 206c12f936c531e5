//! `outbox-relay status`: the backlog at a glance for operators.

use serde::Serialize;

use crate::store::{Backlog, LeaseInfo, Store};

/// What `status` reports.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Unpublished events.
    pub unpublished: i64,
    /// Age of the oldest unpublished event, seconds.
    pub oldest_unpublished_age_seconds: f64,
    /// Lease name.
    pub lease_name: String,
    /// Current holder, if any.
    pub lease_holder: Option<String>,
    /// Fencing epoch.
    pub lease_epoch: Option<i64>,
    /// True while the lease is unexpired.
    pub lease_active: bool,
    /// Seconds since the last renewal.
    pub lease_renewed_seconds_ago: Option<f64>,
    /// Parked events (waiting for an operator).
    pub parked_events: i64,
    /// Parked events by error class.
    pub parked_by_class: std::collections::HashMap<String, i64>,
    /// Events retried after a failure, not parked yet.
    pub retrying_events: i64,
    /// Aggregates held back by a parked event.
    pub blocked_aggregates: i64,
    /// Events waiting behind parked events.
    pub events_waiting_behind_parked: i64,
}

impl Status {
    /// Reads the status.
    ///
    /// # Errors
    /// Database errors.
    pub async fn read(store: &Store, lease_name: &str) -> Result<Self, sqlx::Error> {
        let Backlog {
            unpublished,
            oldest_age_seconds,
        } = store.backlog().await?;
        let lease: Option<LeaseInfo> = store.lease_info(lease_name).await?;
        let parking = store.parking_stats().await?;
        Ok(Self {
            unpublished,
            oldest_unpublished_age_seconds: oldest_age_seconds,
            lease_name: lease_name.to_owned(),
            lease_active: lease.as_ref().is_some_and(|l| l.expires_in_seconds > 0.0),
            lease_holder: lease.as_ref().map(|l| l.holder.clone()),
            lease_epoch: lease.as_ref().map(|l| l.epoch),
            lease_renewed_seconds_ago: lease.as_ref().map(|l| l.renewed_seconds_ago),
            parked_events: parking.parked(),
            retrying_events: parking.retrying,
            blocked_aggregates: parking.blocked_aggregates,
            events_waiting_behind_parked: parking.waiting_behind,
            parked_by_class: parking.parked_by_class,
        })
    }

    /// Human-readable lines.
    pub fn to_text(&self) -> String {
        let lease = match (&self.lease_holder, self.lease_active) {
            (Some(h), true) => format!(
                "held by {h} (epoch {}, renewed {:.1}s ago)",
                self.lease_epoch.unwrap_or_default(),
                self.lease_renewed_seconds_ago.unwrap_or_default()
            ),
            (Some(h), false) => format!(
                "free (last holder {h}, epoch {}, expired): no relay is publishing",
                self.lease_epoch.unwrap_or_default()
            ),
            (None, _) => "never taken: no relay has run against this database".to_owned(),
        };
        let mut classes: Vec<String> = self
            .parked_by_class
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        classes.sort();
        let parked = if self.parked_events == 0 {
            "0".to_owned()
        } else {
            format!(
                "{} ({}), blocking {} aggregates with {} events waiting behind them; see `outbox-relay blocked`",
                self.parked_events,
                classes.join(", "),
                self.blocked_aggregates,
                self.events_waiting_behind_parked
            )
        };
        format!(
            "unpublished events:      {}\noldest unpublished age:  {:.1} s\nrelay lease \"{}\":  {}\nparked events:           {}\nretrying events:         {}\n",
            self.unpublished,
            self.oldest_unpublished_age_seconds,
            self.lease_name,
            lease,
            parked,
            self.retrying_events
        )
    }
}
