//! Dead letters read back, and sent again: [`read_dead_letters`] reads a consumer's letters from
//! the `<topic>.dlq` topics of the topics it consumes, [`redrive`] produces them to that
//! consumer's redrive topic (`<topic>.<consumer>.redrive`).
//!
//! Reading assigns the dead-letter partitions directly and reads each from its low to its high
//! watermark, in a throw-away group that never commits: no consumer group that matters moves.
//! A dead-letter topic is shared by every consumer of its source topic; only the letters whose
//! `dlq.consumer` header names this consumer are its own.
//!
//! A redriven message is the original one: key, value and headers (the `event_id` header
//! included) without the `dlq.*` headers, through an idempotent producer that waits for every
//! replica's ack. It goes to the redrive topic of the consumer that dead-lettered it, not to the
//! shared source topic: only that consumer subscribes to it, so the other consumer groups of the
//! source topic never see the event again (the alternatives: a header naming the target
//! consumer on the source topic still makes every group read, and skip, it, and consumers that
//! do not know the header apply it again; applying straight from the `.dlq` topic cannot tell a
//! letter an operator redrove from one still waiting for a fix). It is partitioned by its key,
//! so the redriven events of one aggregate stay in order among themselves; with respect to the
//! source topic it is applied whenever it arrives, like any redrive: after the aggregate's
//! events that were applied meanwhile. The inbox turns it into a duplicate if the consumer
//! applied it already, so a redrive is safe to repeat. Kafka topics are append-only: a redriven
//! letter stays listed.
//!
//! `--all` sends a letter once: what was redriven is recorded in the consumer's database
//! (`dlq_redriven`, [`record`]), which outlives the inbox rows. Letters go back in the order
//! their events were first consumed ([`DeadLetter::origin`]).
//!
//! Files: `read` (reading a consumer's letters back), `send` (choosing the letters and sending
//! them to the redrive topic), `record` (what was redriven already), `error` (why a
//! dead-letter command failed).

mod error;
mod read;
pub mod record;
mod send;

pub use error::DlqError;
pub use read::{
    read_dead_letters, DeadLetter, REDRIVE_ORIGIN_OFFSET, REDRIVE_ORIGIN_PARTITION,
    REDRIVE_ORIGIN_TOPIC,
};
pub use record::Redriven;
pub use send::{redrive, select, Selection};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;
    use crate::config::RuntimeConfig;
    use crate::dlq::DLQ_REASON;
    use crate::RetryPolicy;

    fn letter(event_id: Option<Uuid>, offset: i64) -> DeadLetter {
        DeadLetter {
            event_id,
            event_type: Some("OrderPaid".into()),
            consumer: "stock".into(),
            reason: "unapplicable".into(),
            error: "e".into(),
            source_topic: Some("t".into()),
            source_partition: Some(0),
            source_offset: Some(offset),
            dead_lettered_at: None,
            topic: "t.dlq".into(),
            partition: 0,
            offset,
            key: Some(b"k".to_vec()),
            payload: None,
            headers: vec![
                (
                    "event_id".into(),
                    event_id.map(|i| i.to_string().into_bytes()),
                ),
                (DLQ_REASON.into(), Some(b"unapplicable".to_vec())),
                ("traceparent".into(), Some(b"00-1".to_vec())),
            ],
        }
    }

    #[test]
    fn redrive_picks_the_newest_letter_per_event_and_refuses_unknown_ids() {
        let a = Uuid::new_v4();
        let b = Uuid::new_v4();
        let letters = vec![
            letter(Some(a), 1),
            letter(None, 2),
            letter(Some(b), 3),
            letter(Some(a), 4),
        ];
        let none = std::collections::HashSet::new();
        let all = select(letters.clone(), Selection::All, "stock", &none).unwrap();
        let picked: Vec<(Option<Uuid>, i64)> = all.iter().map(|l| (l.event_id, l.offset)).collect();
        assert_eq!(
            picked,
            [(Some(b), 3), (Some(a), 4)],
            "newest per event, by source offset, none without id"
        );
        let one = select(letters.clone(), Selection::EventId(b), "stock", &none).unwrap();
        assert_eq!(one.len(), 1);
        let unknown = Uuid::new_v4();
        let err = select(letters, Selection::EventId(unknown), "stock", &none).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("no dead letter of consumer `stock` has event id {unknown}")
        );
    }

    #[test]
    fn redrive_all_leaves_out_redriven_letters_and_orders_by_origin() {
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        // a (source offset 5) was redriven, failed again on the redrive topic and was
        // dead-lettered again at dlq offset 3, carrying its origin; b (offset 7) was read
        // first; c (offset 6) was redriven already (its letter is recorded).
        let mut b7 = letter(Some(b), 1);
        b7.source_offset = Some(7);
        let mut a5 = letter(Some(a), 2);
        a5.source_offset = Some(5);
        let mut a_again = letter(Some(a), 3);
        a_again.source_topic = Some("t.stock.redrive".into());
        a_again.source_offset = Some(0);
        a_again.headers.extend([
            (REDRIVE_ORIGIN_TOPIC.to_owned(), Some(b"t".to_vec())),
            (REDRIVE_ORIGIN_PARTITION.to_owned(), Some(b"0".to_vec())),
            (REDRIVE_ORIGIN_OFFSET.to_owned(), Some(b"5".to_vec())),
        ]);
        let mut c6 = letter(Some(c), 4);
        c6.source_offset = Some(6);
        let letters = vec![b7, a5, a_again, c6];
        let picked = |redriven: &std::collections::HashSet<record::LetterId>| {
            select(letters.clone(), Selection::All, "stock", redriven)
                .unwrap()
                .iter()
                .map(|l| (l.event_id.unwrap(), l.offset))
                .collect::<Vec<_>>()
        };
        let none = std::collections::HashSet::new();
        assert_eq!(
            picked(&none),
            [(a, 3), (c, 4), (b, 1)],
            "by origin offset 5, 6, 7"
        );
        let c_redriven = [("t.dlq".to_owned(), 0, 4)].into_iter().collect();
        assert_eq!(picked(&c_redriven), [(a, 3), (b, 1)], "c never again");
        // An older letter of a redriven: its newest letter is still to be redriven.
        let a_old_redriven = [("t.dlq".to_owned(), 0, 2)].into_iter().collect();
        assert_eq!(picked(&a_old_redriven), [(a, 3), (c, 4), (b, 1)]);
        // --event-id sends a recorded letter again: the operator asked for it.
        let one = select(letters.clone(), Selection::EventId(c), "stock", &c_redriven).unwrap();
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn letters_go_back_to_the_redrive_topic_of_their_consumer_only() {
        let config = RuntimeConfig {
            consumer_name: "stock".into(),
            brokers: "b:9092".into(),
            group_id: "g".into(),
            topics: vec!["t".into()],
            client_config: vec![].into(),
            create_topics: None,
            retry: RetryPolicy::default(),
            max_attempts_deterministic: 1,
            shutdown_timeout: Duration::from_secs(1),
            queue_capacity: 1,
            inbox_retention: None,
            purge: Default::default(),
        };
        let mut l = letter(Some(Uuid::new_v4()), 1);
        assert_eq!(l.redrive_topic(&config).as_deref(), Some("t.stock.redrive"));
        // Read from the redrive topic and dead-lettered again: back to the same redrive topic.
        l.source_topic = Some("t.stock.redrive".into());
        assert_eq!(l.redrive_topic(&config).as_deref(), Some("t.stock.redrive"));
        assert_eq!(l.to_json(&config)["redrive_topic"], "t.stock.redrive");
        l.source_topic = None;
        assert_eq!(l.redrive_topic(&config), None);
    }

    #[test]
    fn redriven_messages_keep_their_headers_but_not_the_dead_letter_ones() {
        let l = letter(Some(Uuid::new_v4()), 1);
        let mut l = l;
        l.headers
            .push((REDRIVE_ORIGIN_OFFSET.to_owned(), Some(b"1".to_vec())));
        let names: Vec<&str> = l.original_headers().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["event_id", "traceparent"]);
    }
}
