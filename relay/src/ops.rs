//! The operator's commands on parked events (`blocked`, `redrive`, `discard`) and on the
//! outbox's buckets (`buckets`). Each prints text
//! or one JSON document and says how it went in its exit code: 0 done, 2 nothing to do for the
//! request (no such event, not parked), 1 for errors (database unreachable, ...).

use serde::Serialize;
use uuid::Uuid;

use crate::parking::{BlockedEvent, Discarded, RedriveTarget};
use crate::store::Store;

/// Exit code when the request matched nothing (unknown event id, event not parked).
pub const EXIT_NOTHING_MATCHED: i32 = 2;

/// What a command prints and its exit code.
#[derive(Debug)]
pub struct Report {
    /// Text or JSON.
    pub output: String,
    /// Process exit code.
    pub code: i32,
}

/// `blocked`: every failed event, parked or retrying.
///
/// # Errors
/// Database errors.
pub async fn blocked(store: &Store, json: bool) -> Result<Report, sqlx::Error> {
    let events = store.blocked_events().await?;
    let output = if json {
        #[derive(Serialize)]
        struct Out<'a> {
            parked: usize,
            retrying: usize,
            events: &'a [BlockedEvent],
        }
        let parked = events.iter().filter(|e| e.state == "parked").count();
        serde_json::to_string(&Out {
            parked,
            retrying: events.len() - parked,
            events: &events,
        })
        .unwrap_or_default()
    } else if events.is_empty() {
        "no parked or retrying events\n".to_owned()
    } else {
        let mut s = String::new();
        for e in &events {
            s.push_str(&format!(
                "{state:<8} event {eid} (outbox id {id}) of {t}:{a}: {class}: {msg}\n         {n} attempts, first failed {first}, age {age:.0}s, {behind} events waiting behind it\n",
                state = e.state,
                eid = e.event_id,
                id = e.outbox_id,
                t = e.aggregate_type,
                a = e.aggregate_id,
                class = e.error_class,
                msg = e.error_message,
                n = e.attempts,
                first = e.first_failed_at.to_rfc3339(),
                age = e.age_seconds,
                behind = e.waiting_behind,
            ));
        }
        s
    };
    Ok(Report { output, code: 0 })
}

/// `redrive`: unparks what `target` selects.
///
/// # Errors
/// Database errors.
pub async fn redrive(
    store: &Store,
    target: &RedriveTarget,
    json: bool,
) -> Result<Report, sqlx::Error> {
    let ids = store.redrive(target).await?;
    let code = if ids.is_empty() && *target != RedriveTarget::All {
        EXIT_NOTHING_MATCHED
    } else {
        0
    };
    let output = if json {
        serde_json::json!({"redriven": ids.len(), "outbox_ids": ids}).to_string()
    } else if ids.is_empty() {
        format!("nothing to redrive: no parked or retrying event matches {target:?}\n")
    } else {
        format!(
            "redriven {} event(s) (outbox ids {ids:?}); the relay sends them before the later events of their aggregates\n",
            ids.len()
        )
    };
    Ok(Report { output, code })
}

/// `discard`: moves a parked event into the audit table.
///
/// # Errors
/// Database errors.
pub async fn discard(
    store: &Store,
    event_id: Uuid,
    reason: &str,
    by: &str,
    json: bool,
) -> Result<Report, sqlx::Error> {
    if reason.trim().is_empty() {
        return Ok(Report {
            output: "--reason must not be empty: it is kept in the audit table\n".into(),
            code: EXIT_NOTHING_MATCHED,
        });
    }
    let result = store.discard(event_id, reason.trim(), by).await?;
    let (code, status, text) = match result {
        Discarded::Done { outbox_id } => (
            0,
            "discarded",
            format!("discarded event {event_id} (outbox id {outbox_id}) into outbox_discarded; its aggregate's later events flow again\n"),
        ),
        Discarded::NotFound => (
            EXIT_NOTHING_MATCHED,
            "not_found",
            format!("no unpublished event {event_id} in the outbox\n"),
        ),
        Discarded::NotParked => (
            EXIT_NOTHING_MATCHED,
            "not_parked",
            format!("event {event_id} is not parked (the relay may be sending it); only parked events can be discarded\n"),
        ),
    };
    let output = if json {
        serde_json::json!({"event_id": event_id, "result": status}).to_string()
    } else {
        text
    };
    Ok(Report { output, code })
}

/// `buckets`: the outbox's bucket count and each bucket's holder; with `set`, changes the
/// count first ([`Store::set_buckets`]: refused, exit code 1 with the reason, while a relay
/// holds a lease of `lease`).
///
/// # Errors
/// Database errors.
pub async fn buckets(
    store: &Store,
    lease: &str,
    set: Option<i64>,
    json: bool,
) -> Result<Report, sqlx::Error> {
    use crate::store::SetBucketsError;
    if let Some(n) = set {
        match store.set_buckets(lease, n).await {
            Ok(_) => {}
            Err(SetBucketsError::Database(e)) => return Err(e),
            Err(refused) => {
                let output = if json {
                    serde_json::json!({ "error": refused.to_string() }).to_string()
                } else {
                    format!("refused: {refused}\n")
                };
                return Ok(Report { output, code: 1 });
            }
        }
    }
    let layout = store.layout().await?;
    let rows = store.bucket_rows(lease, layout).await?;
    let output = if json {
        #[derive(Serialize)]
        struct Bucket<'a> {
            bucket: i16,
            lease: String,
            holder: Option<&'a str>,
        }
        serde_json::json!({
            "buckets": layout.buckets,
            "layout": layout.number,
            "leases": rows.iter().map(|r| Bucket {
                bucket: r.bucket,
                lease: layout.lease_name(lease, r.bucket),
                holder: r.holder.as_deref(),
            }).collect::<Vec<_>>(),
        })
        .to_string()
    } else {
        let mut s = format!(
            "{} bucket{} (layout {})\n",
            layout.buckets,
            if layout.buckets == 1 { "" } else { "s" },
            layout.number
        );
        for r in &rows {
            s.push_str(&format!(
                "bucket {:>3}  {:<24} {}\n",
                r.bucket,
                layout.lease_name(lease, r.bucket),
                r.holder.as_deref().unwrap_or("(free)")
            ));
        }
        s
    };
    Ok(Report { output, code: 0 })
}
