//! The steady load: orders at a fixed rate, each one flow through the harness's client methods
//! ([`System`]) with duplicate requests and duplicate payment callbacks; some refunded before
//! shipping, some after (returned); some of a SKU that runs out (rejected); and marketplace
//! trades pushed through the simulator. A call that fails (a service killed, the database
//! down: the client method panics on an unexpected answer) is retried with the same
//! idempotency key, refund number or transaction until the flow's deadline; a flow past its
//! deadline is abandoned where it is (the audit still holds for any state).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use super::world::World;
use crate::fulfilment::System;

/// How often a flow looks whether its order moved on.
const POLL: Duration = Duration::from_secs(1);

/// How long one order's flow may take before it is abandoned.
const FLOW_DEADLINE: Duration = Duration::from_secs(120);

/// What the load did.
#[derive(Debug, Default, Serialize)]
pub struct LoadStats {
    /// Orders started.
    pub orders: u64,
    /// Flows that reached their last step.
    pub completed: u64,
    /// Flows abandoned at their deadline.
    pub abandoned: u64,
    /// Calls retried (a failed request or an unexpected answer).
    pub retries: u64,
    /// Marketplace trades placed.
    pub trades: u64,
    /// Trades refunded on the platform, by reverse sequence.
    pub trade_refunds: std::collections::BTreeMap<String, u64>,
    /// How the refunds racing shipments ended: `refunded` (the outbound was cancelled) or
    /// `shipped_and_returned` (the parcel had left).
    pub races: std::collections::BTreeMap<String, u64>,
    /// Flows by kind.
    pub flows: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct Counters {
    completed: AtomicU64,
    abandoned: AtomicU64,
    retries: AtomicU64,
    race_refunded: AtomicU64,
    race_returned: AtomicU64,
}

/// One order's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Paid, shipped.
    Ship,
    /// Paid, refunded in full before shipping (intercepted, cancelled, released).
    RefundBeforeShipping,
    /// Paid, shipped, refunded, returned (recalled, restocked).
    RefundAfterShipping,
    /// Paid for the SKU that runs out: rejected or reserved, then shipped if it can be.
    Rare,
    /// Paid, then a full refund and the warehouse's shipment at the same moment: either the
    /// outbound is cancelled (the order `REFUNDED`) or the parcel left (the order `SHIPPED`,
    /// recalled, returned).
    RefundRacingShipment,
    /// Paid, one of the two chairs refunded by line before shipping: the outbound ships a lamp
    /// and one chair, the other chair's reservation is released.
    LineRefundBeforeShipping,
    /// Paid, shipped, one of the two chairs returned by line: the order stays `SHIPPED` with
    /// one chair back, one chair restocked.
    PartialReturn,
}

impl Flow {
    fn name(self) -> &'static str {
        match self {
            Self::Ship => "ship",
            Self::RefundBeforeShipping => "refund_before_shipping",
            Self::RefundAfterShipping => "refund_after_shipping",
            Self::Rare => "rare_sku",
            Self::RefundRacingShipment => "refund_racing_shipment",
            Self::LineRefundBeforeShipping => "line_refund_before_shipping",
            Self::PartialReturn => "partial_return",
        }
    }

    fn pick(rng: &mut StdRng) -> Self {
        match rng.gen_range(0..100) {
            0..=44 => Self::Ship,
            45..=49 => Self::RefundRacingShipment,
            50..=61 => Self::RefundBeforeShipping,
            62..=73 => Self::RefundAfterShipping,
            74..=81 => Self::LineRefundBeforeShipping,
            82..=89 => Self::PartialReturn,
            _ => Self::Rare,
        }
    }
}

/// Runs `call` (a client method of [`System`]) in its own task until it returns without
/// panicking, or `deadline` passes (`None`).
async fn retry<T, F, Fut>(sys: &Arc<System>, c: &Counters, deadline: Instant, call: F) -> Option<T>
where
    F: Fn(Arc<System>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let remaining = deadline.saturating_duration_since(Instant::now());
    outbox_process::poll::poll_every(RETRY_INTERVAL, remaining, || async {
        let answered = tokio::spawn(call(sys.clone())).await.ok();
        if answered.is_none() && Instant::now() < deadline {
            c.retries.fetch_add(1, Ordering::Relaxed);
        }
        answered
    })
    .await
}

/// How long a client call that failed waits before it is tried again.
const RETRY_INTERVAL: Duration = Duration::from_millis(500);

/// Checks every `interval` until `deadline`: `Some(Some(v))` is the answer, `Some(None)` gives
/// up (a client call that gave up), `None` checks again.
async fn poll_flow<T, F, Fut>(interval: Duration, deadline: Instant, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<Option<T>>>,
{
    let remaining = deadline.saturating_duration_since(Instant::now());
    outbox_process::poll::poll_every(interval, remaining, check)
        .await
        .flatten()
}

/// The order's outbounds (`None`: the call gave up).
async fn outbounds(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    order: &str,
) -> Option<Vec<serde_json::Value>> {
    let o = order.to_owned();
    retry(sys, c, deadline, move |s| {
        let o = o.clone();
        async move { s.outbounds_of(&o).await }
    })
    .await
}

/// Waits until the order's outbound is in `status`; its number.
async fn outbound_in(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    order: &str,
    status: &str,
) -> Option<String> {
    poll_flow(POLL, deadline, || async {
        let Some(obs) = outbounds(sys, c, deadline, order).await else {
            return Some(None);
        };
        obs.iter()
            .find(|ob| ob["status"] == status)
            .map(|ob| ob["outbound_no"].as_str().map(str::to_owned))
    })
    .await
}

/// Waits until the order is in one of `statuses`; which one.
async fn order_in(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    order: &str,
    statuses: &[&str],
) -> Option<String> {
    poll_flow(POLL, deadline, || async {
        let o = order.to_owned();
        let Some(v) = retry(sys, c, deadline, move |s| {
            let o = o.clone();
            async move { s.order_of(&o).await }
        })
        .await
        else {
            return Some(None);
        };
        v["status"]
            .as_str()
            .filter(|st| statuses.contains(st))
            .map(|st| Some(st.to_owned()))
    })
    .await
}

/// Waits until the order has an outbound (`Some(Some(no))`) or was cancelled for lack of
/// stock (`Some(None)`).
async fn reserved_or_cancelled(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    order: &str,
) -> Option<Option<String>> {
    poll_flow(POLL, deadline, || async {
        match order_in(sys, c, deadline, order, &["CANCELLED", "PAID"]).await {
            None => return Some(None),
            Some(st) if st == "CANCELLED" => return Some(Some(None)),
            Some(_) => {}
        }
        let Some(obs) = outbounds(sys, c, deadline, order).await else {
            return Some(None);
        };
        obs.first()
            .and_then(|ob| ob["outbound_no"].as_str())
            .map(|no| Some(Some(no.to_owned())))
    })
    .await
}

/// A warehouse action answered 2xx (5xx and connection errors are retried).
async fn warehouse<F, Fut>(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    call: F,
) -> Option<()>
where
    F: Fn(Arc<System>) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    poll_flow(RETRY_INTERVAL, deadline, || async {
        match retry(sys, c, deadline, &call).await {
            None => Some(None),
            Some(true) => Some(Some(())),
            Some(false) => {
                if Instant::now() <= deadline {
                    c.retries.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    })
    .await
}

async fn one_order(
    sys: Arc<System>,
    c: Arc<Counters>,
    n: u64,
    flow: Flow,
    run: String,
) -> Option<()> {
    let deadline = Instant::now() + FLOW_DEADLINE;
    let user = format!("chaos-{n}");
    let key = format!("{run}-order-{n}");
    let items: Vec<(&'static str, i64)> = match flow {
        Flow::Rare => vec![("rare", 1)],
        _ => vec![("lamp", 1), ("chair", 2)],
    };
    // The same request twice at once (a client retrying), then again until it answers.
    let create = |s: Arc<System>| {
        let (user, key, items) = (user.clone(), key.clone(), items.clone());
        async move { s.create_order_keyed(&user, &items, &key, None).await }
    };
    let twin = tokio::spawn(create(sys.clone()));
    let (order, amount) = retry(&sys, &c, deadline, create).await?;
    let _ = twin.await;
    // The provider calls back twice.
    for _ in 0..2 {
        let o = order.clone();
        retry(&sys, &c, deadline, move |s| {
            let o = o.clone();
            async move { s.pay(&o, amount).await }
        })
        .await?;
    }
    let outbound = if flow == Flow::Rare {
        // Out of stock: cancelled; else reserved and on its way to the warehouse.
        match reserved_or_cancelled(&sys, &c, deadline, &order).await? {
            Some(no) => no,
            None => return Some(()),
        }
    } else {
        outbound_in(&sys, &c, deadline, &order, "CREATED").await?
    };
    let refund_no = format!("{run}-rf-{n}");
    if flow == Flow::RefundBeforeShipping {
        let (o, r) = (order.clone(), refund_no.clone());
        retry(&sys, &c, deadline, move |s| {
            let (o, r) = (o.clone(), r.clone());
            async move { s.request_refund(&o, &r).await }
        })
        .await?;
        outbound_in(&sys, &c, deadline, &order, "INTERCEPTED").await?;
        succeed_refund(&sys, &c, deadline, &refund_no).await?;
        outbound_in(&sys, &c, deadline, &order, "CANCELLED").await?;
        return Some(());
    }
    if flow == Flow::RefundRacingShipment {
        return refund_racing_shipment(&sys, &c, deadline, &order, &outbound, &refund_no, &run, n)
            .await;
    }
    if flow == Flow::LineRefundBeforeShipping {
        line_refund(&sys, &c, deadline, &order, &refund_no).await?;
        outbound_in(&sys, &c, deadline, &order, "INTERCEPTED").await?;
        succeed_refund(&sys, &c, deadline, &refund_no).await?;
        // The chair refunded is out of the outbound; the rest ships.
        outbound_in(&sys, &c, deadline, &order, "CREATED").await?;
    }
    let (ob, tracking) = (outbound.clone(), format!("{run}-T-{n}"));
    warehouse(&sys, &c, deadline, move |s| {
        let (ob, t) = (ob.clone(), tracking.clone());
        async move { s.ship(&ob, "DHL", &t).await.0.is_success() }
    })
    .await?;
    if flow == Flow::PartialReturn {
        order_in(&sys, &c, deadline, &order, &["SHIPPED"]).await?;
        line_refund(&sys, &c, deadline, &order, &refund_no).await?;
        outbound_in(&sys, &c, deadline, &order, "RECALL").await?;
        succeed_refund(&sys, &c, deadline, &refund_no).await?;
        receive_return(&sys, &c, deadline, &outbound).await?;
        // One chair back, the rest with the buyer: the outbound shipped again, the order too.
        return outbound_in(&sys, &c, deadline, &order, "SHIPPED")
            .await
            .map(|_| ());
    }
    if flow != Flow::RefundAfterShipping {
        return Some(());
    }
    order_in(&sys, &c, deadline, &order, &["SHIPPED"]).await?;
    let (o, r) = (order.clone(), refund_no.clone());
    retry(&sys, &c, deadline, move |s| {
        let (o, r) = (o.clone(), r.clone());
        async move { s.request_refund(&o, &r).await }
    })
    .await?;
    outbound_in(&sys, &c, deadline, &order, "RECALL").await?;
    succeed_refund(&sys, &c, deadline, &refund_no).await?;
    receive_return(&sys, &c, deadline, &outbound).await?;
    order_in(&sys, &c, deadline, &order, &["RETURNED"]).await?;
    Some(())
}

/// A full refund requested while the warehouse ships (both at once), then its success: the
/// warehouse's word decides (the parcel may already be on its way). Ends with the order
/// `REFUNDED`, or shipped, recalled and `RETURNED`.
#[allow(clippy::too_many_arguments)]
async fn refund_racing_shipment(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    order: &str,
    outbound: &str,
    refund_no: &str,
    run: &str,
    n: u64,
) -> Option<()> {
    let (o, r) = (order.to_owned(), refund_no.to_owned());
    let refund = retry(sys, c, deadline, move |s| {
        let (o, r) = (o.clone(), r.clone());
        async move { s.request_refund(&o, &r).await }
    });
    let (ob, tracking) = (outbound.to_owned(), format!("{run}-T-{n}"));
    let ship = warehouse(sys, c, deadline, move |s| {
        let (ob, t) = (ob.clone(), tracking.clone());
        // Refused (409) once the refund intercepted the outbound first: that is the race too.
        async move {
            let status = s.ship(&ob, "DHL", &t).await.0;
            status.is_success() || status == reqwest::StatusCode::CONFLICT
        }
    });
    let (refunded, _) = tokio::join!(refund, ship);
    refunded?;
    succeed_refund(sys, c, deadline, refund_no).await?;
    if order_in(sys, c, deadline, order, &["REFUNDED", "SHIPPED"]).await? == "REFUNDED" {
        c.race_refunded.fetch_add(1, Ordering::Relaxed);
        return Some(());
    }
    outbound_in(sys, c, deadline, order, "RECALL").await?;
    receive_return(sys, c, deadline, outbound).await?;
    order_in(sys, c, deadline, order, &["RETURNED"]).await?;
    c.race_returned.fetch_add(1, Ordering::Relaxed);
    Some(())
}

/// The reverse sequence the `k`-th refunded trade goes through on the platform: a refund
/// lowered before it succeeds (a partial refund; the rest ships), a full refund whose success
/// has the same `modified` as its request (the platform then closes the paid trade), a refund
/// that fails, or a refund of the trade's line whose amount the buyer raises to all of it
/// before it succeeds (the platform closes the paid trade).
fn trade_refund(k: u64, tid: &str) -> (&'static str, serde_json::Value) {
    let refund_id = format!("R-{tid}");
    match k % 4 {
        3 => (
            "line_amount_raised",
            serde_json::json!({"refund_id": refund_id, "refund_cents": 1_000,
                "statuses": ["WAIT_SELLER_AGREE", "WAIT_SELLER_AGREE", "SUCCESS"],
                "amounts": [400, 1_000, 1_000], "items": [{"sku_id": "MK", "quantity": 1}]}),
        ),
        0 => (
            "amount_lowered",
            serde_json::json!({"refund_id": refund_id, "refund_cents": 1_000,
                "statuses": ["WAIT_SELLER_AGREE", "WAIT_SELLER_AGREE", "SUCCESS"],
                "amounts": [1_000, 300, 300]}),
        ),
        1 => (
            "same_modified_success",
            serde_json::json!({"refund_id": refund_id, "refund_cents": 1_000,
                "statuses": ["WAIT_SELLER_AGREE", "SUCCESS"], "same_modified": true}),
        ),
        _ => (
            "failed",
            serde_json::json!({"refund_id": refund_id, "refund_cents": 1_000,
                "statuses": ["WAIT_SELLER_AGREE", "FAILED"]}),
        ),
    }
}

/// The warehouse records the return of `outbound`.
async fn receive_return(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    outbound: &str,
) -> Option<()> {
    let ob = outbound.to_owned();
    warehouse(sys, c, deadline, move |s| {
        let ob = ob.clone();
        async move { s.return_received(&ob).await.0.is_success() }
    })
    .await
}

/// A return-and-refund of one of the order's two chairs.
async fn line_refund(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    order: &str,
    refund_no: &str,
) -> Option<()> {
    let (o, r) = (order.to_owned(), refund_no.to_owned());
    retry(sys, c, deadline, move |s| {
        let (o, r) = (o.clone(), r.clone());
        async move { s.request_line_refund(&o, &r, &[("chair", 1)]).await }
    })
    .await
}

async fn succeed_refund(
    sys: &Arc<System>,
    c: &Counters,
    deadline: Instant,
    refund_no: &str,
) -> Option<()> {
    let r = refund_no.to_owned();
    retry(sys, c, deadline, move |s| {
        let r = r.clone();
        async move { s.refund_outcome(&r, "SUCCESS").await }
    })
    .await
}

/// Runs the load at `rate` orders per second until `until`, then waits for the flows (each
/// bounded by its deadline). Every fifth tick also places a marketplace trade.
pub async fn run(world: Arc<World>, rate: f64, until: Instant, seed: u64) -> LoadStats {
    let counters = Arc::new(Counters::default());
    let mut stats = LoadStats::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x10ad);
    let run_id = world
        .sys
        .prefix
        .split('.')
        .next()
        .unwrap_or("run")
        .to_owned();
    let mut flows = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    while Instant::now() < until {
        tick.tick().await;
        n += 1;
        let flow = Flow::pick(&mut rng);
        *stats.flows.entry(flow.name().to_owned()).or_default() += 1;
        let (sys, c, run) = (world.sys.clone(), counters.clone(), run_id.clone());
        flows.spawn(async move {
            let done = one_order(sys, c.clone(), n, flow, run).await.is_some();
            let counter = if done { &c.completed } else { &c.abandoned };
            counter.fetch_add(1, Ordering::Relaxed);
        });
        if n.is_multiple_of(5) {
            let (w, tid) = (world.clone(), format!("{run_id}-tid-{n}"));
            // Every third trade is refunded on the platform through one of the reverse
            // sequences.
            let refund = n.is_multiple_of(15).then(|| trade_refund(n / 15, &tid));
            if let Some((name, _)) = &refund {
                *stats.trade_refunds.entry((*name).to_owned()).or_default() += 1;
            }
            flows.spawn(async move {
                // The simulator keeps the trade whatever happens to the order service; the
                // push or the compensation pass brings it over.
                let deadline = Instant::now() + FLOW_DEADLINE;
                let placed =
                    outbox_process::poll::poll_every(RETRY_INTERVAL, FLOW_DEADLINE, || async {
                        w.trade(&tid).await.then_some(())
                    })
                    .await;
                if let (Some(()), Some((_, body))) = (placed, refund) {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    outbox_process::poll::poll_every(RETRY_INTERVAL, remaining, || async {
                        w.refund_trade(&tid, &body).await.then_some(())
                    })
                    .await;
                }
            });
            stats.trades += 1;
        }
    }
    stats.orders = n;
    while flows.join_next().await.is_some() {}
    stats.completed = counters.completed.load(Ordering::Relaxed);
    stats.abandoned = counters.abandoned.load(Ordering::Relaxed);
    stats.retries = counters.retries.load(Ordering::Relaxed);
    for (name, n) in [
        ("refunded", &counters.race_refunded),
        ("shipped_and_returned", &counters.race_returned),
    ] {
        stats
            .races
            .insert(name.to_owned(), n.load(Ordering::Relaxed));
    }
    stats
}
