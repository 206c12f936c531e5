//! The event checks: the broker against the ledgers (every published event on its topic, each
//! aggregate's events in outbox-id order), the inboxes and the committed offsets (every message
//! a consumer moved past applied or dead-lettered).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::broker::Record;
use crate::report::Violation;
use crate::store::LedgerRow;

/// One consumer as the event checks see it.
#[derive(Debug, Clone)]
pub struct ConsumerView {
    /// The inbox's `consumer_name` (also `dlq.consumer` of its dead letters).
    pub name: String,
    /// Its consumer group.
    pub group: String,
    /// The topics it subscribes to.
    pub topics: Vec<String>,
    /// Whether it applies events of this type (the others get no inbox row).
    pub handles: fn(&str) -> bool,
    /// The group's committed offsets (`(topic, partition) -> next offset`).
    pub committed: HashMap<(String, i32), i64>,
    /// Event ids in its inbox (lower-case).
    pub inbox: HashSet<String>,
}

/// One database's ledger.
#[derive(Debug, Clone)]
pub struct LedgerView {
    /// The database's name in the report (`order`, `wms`, `stock`).
    pub database: String,
    /// Its rows.
    pub rows: Vec<LedgerRow>,
}

/// What the event checks counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EventCounts {
    /// Messages read (all topics, dead-letter topics included).
    pub messages: i64,
    /// Copies of an event already seen on the same topic (at-least-once duplicates).
    pub broker_duplicates: i64,
    /// Dead letters read.
    pub dead_letters: i64,
    /// Per consumer: messages behind its committed offset that were checked.
    pub checked: BTreeMap<String, i64>,
    /// Per consumer: messages still ahead of its committed offset.
    pub ahead: BTreeMap<String, i64>,
    /// Ledger events that left the outbox (published) and were looked for on the broker.
    pub ledger_published: i64,
}

/// The event checks: every published ledger event on its topic; the first occurrences of each
/// aggregate's events in outbox-id order; every message behind a consumer's committed offset
/// in its inbox or its dead letters (messages older than `inbox_cutoff_ms` are left out).
pub fn events(
    records: &[Record],
    consumers: &[ConsumerView],
    ledgers: &[LedgerView],
    prefix: &str,
    inbox_cutoff_ms: i64,
) -> (EventCounts, Vec<Violation>) {
    let mut out = Vec::new();
    let mut counts = EventCounts {
        messages: records.len() as i64,
        ..EventCounts::default()
    };
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted
        .sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));

    // Dead letters by where they came from and who sent them.
    let mut dead: HashSet<(&str, &str, i32, i64)> = HashSet::new();
    for r in &sorted {
        if let Some(d) = &r.dead_letter {
            counts.dead_letters += 1;
            dead.insert((&d.consumer, &d.topic, d.partition, d.offset));
        }
    }
    let dead_letter_topics: HashSet<&str> = sorted
        .iter()
        .filter(|r| r.dead_letter.is_some())
        .map(|r| r.topic.as_str())
        .collect();

    // Where each event is on the broker: topic -> event ids.
    let mut on_topic: HashMap<&str, HashSet<&str>> = HashMap::new();
    for r in &sorted {
        if let Some(e) = &r.event_id {
            if !on_topic.entry(&r.topic).or_default().insert(e) && r.dead_letter.is_none() {
                counts.broker_duplicates += 1;
            }
        }
    }

    // Ledger: every published event is on its topic.
    let mut by_event: HashMap<&str, &LedgerRow> = HashMap::new();
    for l in ledgers {
        for row in &l.rows {
            by_event.insert(&row.event_id, row);
            if row.unpublished || row.discarded {
                continue;
            }
            counts.ledger_published += 1;
            let topic = ledger_topic(row, prefix);
            let found = on_topic
                .get(topic.as_str())
                .is_some_and(|s| s.contains(row.event_id.as_str()));
            if !found {
                out.push(Violation::EventNotPublished {
                    database: l.database.clone(),
                    outbox_id: row.outbox_id,
                    event_id: row.event_id.clone(),
                    topic,
                });
            }
        }
    }

    // Order: first occurrences per (topic, aggregate) in outbox-id order.
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut last: HashMap<(&str, &str, &str), i64> = HashMap::new();
    for r in &sorted {
        if dead_letter_topics.contains(r.topic.as_str()) {
            continue;
        }
        let Some(e) = r.event_id.as_deref() else {
            continue;
        };
        if !seen.insert((&r.topic, e)) {
            continue;
        }
        let Some(row) = by_event.get(e) else {
            continue;
        };
        let key = (
            r.topic.as_str(),
            row.aggregate_type.as_str(),
            row.aggregate_id.as_str(),
        );
        let max = last.entry(key).or_insert(i64::MIN);
        if row.outbox_id < *max {
            out.push(Violation::OrderViolation {
                topic: r.topic.clone(),
                aggregate_id: row.aggregate_id.clone(),
                event_id: e.to_owned(),
                outbox_id: row.outbox_id,
                after_outbox_id: *max,
                partition: r.partition,
                offset: r.offset,
            });
        } else {
            *max = row.outbox_id;
        }
    }

    // Consumers: behind the committed offset means applied (inbox) or dead-lettered.
    for c in consumers {
        let topics: HashSet<&str> = c.topics.iter().map(String::as_str).collect();
        let (mut checked, mut ahead) = (0, 0);
        for r in sorted.iter().filter(|r| topics.contains(r.topic.as_str())) {
            let committed = c
                .committed
                .get(&(r.topic.clone(), r.partition))
                .copied()
                .unwrap_or(0);
            if r.offset >= committed {
                ahead += 1;
                continue;
            }
            if r.timestamp_ms.is_some_and(|t| t < inbox_cutoff_ms) {
                continue;
            }
            // Without an event type the consumer dead-letters it; with one it ignores, it
            // moves on without an inbox row.
            if r.event_type.as_deref().is_some_and(|t| !(c.handles)(t)) {
                continue;
            }
            checked += 1;
            let applied = r
                .event_id
                .as_deref()
                .is_some_and(|e| c.inbox.contains(&e.to_ascii_lowercase()));
            let dead_lettered =
                dead.contains(&(c.name.as_str(), r.topic.as_str(), r.partition, r.offset));
            if !applied && !dead_lettered {
                out.push(Violation::EventNotApplied {
                    consumer: c.name.clone(),
                    group: c.group.clone(),
                    topic: r.topic.clone(),
                    partition: r.partition,
                    offset: r.offset,
                    committed,
                    event_id: r
                        .event_id
                        .clone()
                        .unwrap_or_else(|| "(no event_id header)".into()),
                });
            }
        }
        counts.checked.insert(c.name.clone(), checked);
        counts.ahead.insert(c.name.clone(), ahead);
    }
    (counts, out)
}

/// The topic a ledger row's event goes to (the row's topic, else the routing).
pub fn ledger_topic(row: &LedgerRow, prefix: &str) -> String {
    match &row.topic {
        Some(t) if !t.is_empty() => t.clone(),
        _ => format!("{prefix}{}", row.aggregate_type),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::DeadLetterSource;

    fn rec(topic: &str, p: i32, o: i64, ev: &str) -> Record {
        Record {
            topic: topic.into(),
            partition: p,
            offset: o,
            key: Some("k".into()),
            event_id: Some(ev.into()),
            event_type: Some("OrderPaid".into()),
            dead_letter: None,
            timestamp_ms: Some(1_000),
        }
    }

    fn ledger_row(id: i64, ev: &str, agg: &str) -> LedgerRow {
        LedgerRow {
            outbox_id: id,
            event_id: ev.into(),
            aggregate_type: "order".into(),
            aggregate_id: agg.into(),
            topic: None,
            unpublished: false,
            discarded: false,
        }
    }

    #[test]
    fn first_occurrences_out_of_id_order_are_named_and_duplicates_are_not() {
        let records = [
            rec("p.order", 0, 0, "e1"),
            rec("p.order", 0, 1, "e3"),
            rec("p.order", 0, 2, "e2"),
            rec("p.order", 0, 3, "e1"),
        ];
        let ledgers = [LedgerView {
            database: "order".into(),
            rows: vec![
                ledger_row(1, "e1", "a"),
                ledger_row(2, "e2", "a"),
                ledger_row(3, "e3", "a"),
                ledger_row(4, "e4", "b"),
            ],
        }];
        let (counts, v) = events(&records, &[], &ledgers, "p.", 0);
        assert_eq!(counts.broker_duplicates, 1);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(matches!(&v[0], Violation::EventNotPublished { event_id, .. } if event_id == "e4"));
        assert!(
            matches!(&v[1], Violation::OrderViolation { event_id, outbox_id: 2, after_outbox_id: 3, .. } if event_id == "e2")
        );
    }

    #[test]
    fn a_message_behind_the_committed_offset_is_in_the_inbox_or_dead_lettered() {
        let mut dl = rec("p.order.dlq", 0, 0, "e2");
        dl.dead_letter = Some(DeadLetterSource {
            consumer: "wms".into(),
            topic: "p.order".into(),
            partition: 0,
            offset: 1,
        });
        let records = [
            rec("p.order", 0, 0, "e1"),
            rec("p.order", 0, 1, "e2"),
            rec("p.order", 0, 2, "e3"),
            rec("p.order", 0, 3, "e4"),
            dl,
        ];
        let c = ConsumerView {
            name: "wms".into(),
            group: "g".into(),
            topics: vec!["p.order".into()],
            handles: |t| t == "OrderPaid",
            committed: HashMap::from([(("p.order".to_owned(), 0), 3)]),
            inbox: HashSet::from(["e1".to_owned()]),
        };
        let (counts, v) = events(&records, &[c], &[], "p.", 0);
        assert_eq!(counts.checked["wms"], 3);
        assert_eq!(counts.ahead["wms"], 1);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            matches!(&v[0], Violation::EventNotApplied { event_id, offset: 2, .. } if event_id == "e3")
        );
    }
}
