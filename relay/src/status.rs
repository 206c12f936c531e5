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
        Ok(Self {
            unpublished,
            oldest_unpublished_age_seconds: oldest_age_seconds,
            lease_name: lease_name.to_owned(),
            lease_active: lease.as_ref().is_some_and(|l| l.expires_in_seconds > 0.0),
            lease_holder: lease.as_ref().map(|l| l.holder.clone()),
            lease_epoch: lease.as_ref().map(|l| l.epoch),
            lease_renewed_seconds_ago: lease.as_ref().map(|l| l.renewed_seconds_ago),
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
        format!(
            "unpublished events:      {}\noldest unpublished age:  {:.1} s\nrelay lease \"{}\":  {}\n",
            self.unpublished, self.oldest_unpublished_age_seconds, self.lease_name, lease
        )
    }
}
