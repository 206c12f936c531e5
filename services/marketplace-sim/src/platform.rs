//! The platform's state: trades and their refunds, each change stamped with a strictly
//! increasing `modified`, pushed to the seller at least once and always queryable; the ship
//! API; and a log of every call, so tests count effects.
//!
//! This file holds the state and its changes; `model.rs` the types it keeps and answers,
//! `messages.rs` the messages it sends, `push.rs` how they are sent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use outbox_http::signature::CallbackSecret;
use serde_json::Value;

use crate::config::Faults;

mod messages;
mod model;
mod push;

use messages::{refund_message, trade_message};
pub use model::{Calls, Item, PlatformError, Refund, RefundStep, ShipCall, ShipOutcome, Trade};

#[derive(Debug, Default)]
struct State {
    trades: BTreeMap<String, Trade>,
    last_modified: i64,
    ship_attempts: BTreeMap<String, u32>,
    calls: Calls,
    faults: Faults,
}

/// The platform; cheap to clone.
#[derive(Debug, Clone)]
pub struct Platform {
    state: Arc<Mutex<State>>,
    secret: CallbackSecret,
    http: reqwest::Client,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl State {
    fn tick(&mut self) -> i64 {
        self.last_modified = now_ms().max(self.last_modified + 1);
        self.calls.changes += 1;
        self.last_modified
    }

    /// Moves a trade and returns its message.
    fn set_trade_status(&mut self, tid: &str, status: &str) -> Option<Value> {
        let modified = self.tick();
        let t = self.trades.get_mut(tid)?;
        t.status = status.to_owned();
        t.modified = modified;
        Some(trade_message(&uuid::Uuid::new_v4().to_string(), t))
    }
}

impl Platform {
    /// A platform signing its pushes with `secret`.
    pub fn new(secret: CallbackSecret, faults: Faults) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                faults,
                ..State::default()
            })),
            secret,
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(30))
                .build()
                .unwrap_or_default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the fault settings.
    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// The fault settings.
    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    /// The call log.
    pub fn calls(&self) -> Calls {
        self.lock().calls.clone()
    }

    /// A trade's latest snapshot.
    pub fn trade(&self, tid: &str) -> Option<Trade> {
        self.lock().trades.get(tid).cloned()
    }

    /// Every trade.
    pub fn trades(&self) -> Vec<Trade> {
        self.lock().trades.values().cloned().collect()
    }

    /// A buyer places a trade (`WAIT_BUYER_PAY`) and, if `pay`, pays it
    /// (`WAIT_SELLER_SEND_GOODS`); each change is pushed.
    ///
    /// # Errors
    /// [`PlatformError::Conflict`] when the tid exists.
    pub async fn create_trade(
        &self,
        tid: String,
        buyer_id: String,
        items: Vec<Item>,
        paid_cents: i64,
        pay: bool,
    ) -> Result<Trade, PlatformError> {
        let mut messages = Vec::new();
        let trade = {
            let mut s = self.lock();
            if s.trades.contains_key(&tid) {
                return Err(PlatformError::Conflict(format!("trade {tid} exists")));
            }
            let modified = s.tick();
            let t = Trade {
                tid: tid.clone(),
                buyer_id,
                items,
                paid_cents,
                paid: false,
                status: "WAIT_BUYER_PAY".into(),
                modified,
                out_sid: None,
                refunds: vec![],
            };
            messages.push(trade_message(&uuid::Uuid::new_v4().to_string(), &t));
            s.trades.insert(tid.clone(), t);
            if pay {
                if let Some(t) = s.trades.get_mut(&tid) {
                    t.paid = true;
                }
                messages.extend(s.set_trade_status(&tid, "WAIT_SELLER_SEND_GOODS"));
            }
            s.trades
                .get(&tid)
                .cloned()
                .ok_or(PlatformError::UnknownTrade)?
        };
        self.push_all(messages).await;
        Ok(trade)
    }

    /// A refund goes through `steps` in order (each a snapshot with a newer `modified`, or all
    /// with one `modified` when `same_modified`: a platform that stamps in seconds), each with
    /// its own amount and lines (the buyer may change them while the refund is open); the snapshots are
    /// pushed, newest first when `refunds_out_of_order` is set. A refund of everything paid
    /// that succeeds before shipping closes the trade.
    ///
    /// # Errors
    /// [`PlatformError::UnknownTrade`], [`PlatformError::Conflict`] when not paid.
    pub async fn refund(
        &self,
        tid: &str,
        refund_id: String,
        kind: String,
        steps: Vec<RefundStep>,
        same_modified: bool,
    ) -> Result<Trade, PlatformError> {
        let mut messages = Vec::new();
        let (trade, reverse) = {
            let mut s = self.lock();
            let t = s.trades.get(tid).ok_or(PlatformError::UnknownTrade)?;
            if t.status == "WAIT_BUYER_PAY" || t.status == "TRADE_CLOSED" {
                return Err(PlatformError::Conflict(format!("trade is {}", t.status)));
            }
            let shipped = t.out_sid.is_some();
            let full = steps.last().is_some_and(|l| l.refund_cents >= t.paid_cents);
            let mut stamp = None;
            for step in &steps {
                let modified = match stamp {
                    Some(m) if same_modified => m,
                    _ => s.tick(),
                };
                stamp = Some(modified);
                let t = s.trades.get_mut(tid).ok_or(PlatformError::UnknownTrade)?;
                let r = Refund {
                    refund_id: refund_id.clone(),
                    status: step.status.clone(),
                    refund_cents: step.refund_cents,
                    kind: kind.clone(),
                    items: step.items.clone(),
                    modified,
                };
                messages.push(refund_message(&uuid::Uuid::new_v4().to_string(), tid, &r));
                match t.refunds.iter_mut().find(|x| x.refund_id == refund_id) {
                    Some(x) => *x = r,
                    None => t.refunds.push(r),
                }
            }
            let reverse = s.faults.refunds_out_of_order;
            if reverse {
                messages.reverse();
            }
            if steps.last().map(|l| l.status.as_str()) == Some("SUCCESS") && full && !shipped {
                messages.extend(s.set_trade_status(tid, "TRADE_CLOSED"));
            }
            (s.trades.get(tid).cloned(), reverse)
        };
        tracing::info!(trade.tid = %tid, refund.id = %refund_id, out_of_order = reverse, "Refund changed");
        self.push_all(messages).await;
        trade.ok_or(PlatformError::UnknownTrade)
    }

    /// The buyer confirms receipt of a shipped trade (`TRADE_FINISHED`).
    ///
    /// # Errors
    /// [`PlatformError::UnknownTrade`], [`PlatformError::Conflict`] unless shipped.
    pub async fn finish(&self, tid: &str) -> Result<Trade, PlatformError> {
        let message = {
            let mut s = self.lock();
            let t = s.trades.get(tid).ok_or(PlatformError::UnknownTrade)?;
            if t.status != "WAIT_BUYER_CONFIRM" {
                return Err(PlatformError::Conflict(format!("trade is {}", t.status)));
            }
            s.set_trade_status(tid, "TRADE_FINISHED")
        };
        self.push_all(message.into_iter().collect()).await;
        self.trade(tid).ok_or(PlatformError::UnknownTrade)
    }

    /// The seller reports a shipment. Answers per the fault settings; a success moves the
    /// trade to `WAIT_BUYER_CONFIRM` and pushes it.
    pub async fn ship(&self, tid: &str, out_sid: &str) -> ShipOutcome {
        let (outcome, message) = {
            let mut s = self.lock();
            let attempts = {
                let a = s.ship_attempts.entry(tid.to_owned()).or_default();
                *a += 1;
                *a
            };
            let fail_times = s.faults.ship_fail_times;
            let refuse = s.faults.ship_refuse;
            let (outcome, message) = match s.trades.get(tid) {
                None => (ShipOutcome::UnknownTrade, None),
                Some(_) if refuse => (ShipOutcome::Refused, None),
                Some(_) if attempts <= fail_times => (ShipOutcome::Failed, None),
                Some(t) => match &t.out_sid {
                    Some(sid) if sid == out_sid => (ShipOutcome::AlreadyShipped, None),
                    Some(sid) => (ShipOutcome::Conflict(format!("shipped with {sid}")), None),
                    None if t.status != "WAIT_SELLER_SEND_GOODS" => (
                        ShipOutcome::Conflict(format!("trade is {}", t.status)),
                        None,
                    ),
                    None => {
                        if let Some(t) = s.trades.get_mut(tid) {
                            t.out_sid = Some(out_sid.to_owned());
                        }
                        (
                            ShipOutcome::Shipped,
                            s.set_trade_status(tid, "WAIT_BUYER_CONFIRM"),
                        )
                    }
                },
            };
            let result = match &outcome {
                ShipOutcome::Shipped => "shipped",
                ShipOutcome::AlreadyShipped => "already_shipped",
                ShipOutcome::Failed => "failed",
                ShipOutcome::Refused => "refused",
                ShipOutcome::Conflict(_) => "conflict",
                ShipOutcome::UnknownTrade => "unknown_trade",
            };
            s.calls.ship.push(ShipCall {
                tid: tid.to_owned(),
                out_sid: out_sid.to_owned(),
                result: result.to_owned(),
            });
            (outcome, message)
        };
        self.push_all(message.into_iter().collect()).await;
        outcome
    }

    /// The query API: the latest snapshot of every trade and refund changed after `since`,
    /// oldest first, and the newest `modified` among them (the caller's next watermark).
    pub fn changes_since(&self, since: i64) -> (Vec<Value>, i64) {
        let mut s = self.lock();
        s.calls.queries += 1;
        let mut out: Vec<(i64, Value)> = Vec::new();
        for t in s.trades.values() {
            if t.modified > since {
                let id = format!("q-{}-{}-{}", t.tid, t.status, t.modified);
                out.push((t.modified, trade_message(&id, t)));
            }
            for r in t.refunds.iter().filter(|r| r.modified > since) {
                let id = format!("q-{}-{}-{}", r.refund_id, r.status, r.modified);
                out.push((r.modified, refund_message(&id, &t.tid, r)));
            }
        }
        out.sort_by_key(|(m, _)| *m);
        let until = out.last().map_or(since, |(m, _)| *m);
        (out.into_iter().map(|(_, v)| v).collect(), until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(faults: Faults) -> Platform {
        Platform::new(CallbackSecret::new("s").unwrap(), faults)
    }

    fn items() -> Vec<Item> {
        vec![Item {
            sku_id: "A".into(),
            quantity: 1,
        }]
    }

    #[tokio::test]
    async fn the_ship_api_fails_as_configured_then_answers_already_shipped_for_a_retry() {
        let p = platform(Faults {
            ship_fail_times: 2,
            ..Faults::default()
        });
        p.create_trade("T1".into(), "b".into(), items(), 100, true)
            .await
            .unwrap();
        assert_eq!(p.ship("T1", "SF1").await, ShipOutcome::Failed);
        assert_eq!(p.ship("T1", "SF1").await, ShipOutcome::Failed);
        assert_eq!(p.ship("T1", "SF1").await, ShipOutcome::Shipped);
        assert_eq!(p.ship("T1", "SF1").await, ShipOutcome::AlreadyShipped);
        assert!(matches!(
            p.ship("T1", "SF2").await,
            ShipOutcome::Conflict(_)
        ));
        assert_eq!(p.ship("T9", "SF1").await, ShipOutcome::UnknownTrade);
        assert_eq!(p.trade("T1").unwrap().status, "WAIT_BUYER_CONFIRM");
        let results: Vec<String> = p.calls().ship.into_iter().map(|c| c.result).collect();
        assert_eq!(
            results,
            [
                "failed",
                "failed",
                "shipped",
                "already_shipped",
                "conflict",
                "unknown_trade"
            ]
        );
    }

    #[tokio::test]
    async fn changes_are_queryable_oldest_first_and_a_full_refund_closes_the_trade() {
        let p = platform(Faults::default());
        p.create_trade("T1".into(), "b".into(), items(), 100, true)
            .await
            .unwrap();
        p.refund(
            "T1",
            "R1".into(),
            "RETURN_AND_REFUND".into(),
            RefundStep::each(&["WAIT_SELLER_AGREE", "SUCCESS"], 100),
            false,
        )
        .await
        .unwrap();
        assert_eq!(p.trade("T1").unwrap().status, "TRADE_CLOSED");
        let (all, until) = p.changes_since(0);
        // Latest snapshots only: the trade (closed) and the refund (succeeded).
        assert_eq!(all.len(), 2);
        assert_eq!(all[0]["refund"]["status"], "SUCCESS");
        assert_eq!(all[1]["trade"]["status"], "TRADE_CLOSED");
        assert_eq!(
            all[1]["trade"]["paid_cents"], 100,
            "a paid trade says so when closed"
        );
        assert_eq!(all[1]["modified"].as_i64(), Some(until));
        assert!(p.changes_since(until).0.is_empty());
        // Nothing was pushed (no push URL): every change counts as dropped.
        assert_eq!(p.calls().pushes_dropped, p.calls().changes);
    }
}
