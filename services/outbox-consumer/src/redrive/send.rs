//! Dead letters sent again: [`select`] picks the newest letter per event (for `--all`, only
//! those not redriven yet) in the order of their origin, [`redrive`] produces each, as the
//! original message, to the redrive topic of the consumer that dead-lettered it, and records
//! it ([`super::record`]).

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use uuid::Uuid;

use std::collections::HashSet;

use sqlx::PgPool;

use super::error::DlqError;
use super::read::{
    DeadLetter, REDRIVE_ORIGIN_OFFSET, REDRIVE_ORIGIN_PARTITION, REDRIVE_ORIGIN_TOPIC,
    REQUEST_TIMEOUT,
};
use super::record::{self, LetterId, Redriven};
use crate::config::{dead_letter_producer_config, RuntimeConfig};

/// How long a redriven message may wait for the broker's acknowledgement.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Which dead letters `redrive` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The newest letter of one event.
    EventId(Uuid),
    /// The newest letter of every event; letters without an event id are skipped (no consumer
    /// can apply them).
    All,
}

/// The letters to redrive out of `letters` (in reading order): the newest one per event id,
/// ordered by their origin ([`DeadLetter::origin`]: the offset their event was first consumed
/// at), so that an aggregate's events go back in the order they were first consumed. For
/// [`Selection::All`], an event whose newest letter is in `redriven` (it was redriven
/// already) is left out, however long ago; [`Selection::EventId`] sends it again.
///
/// # Errors
/// [`DlqError::UnknownEventId`] when an event id is asked for that no letter has.
pub fn select(
    letters: Vec<DeadLetter>,
    selection: Selection,
    consumer: &str,
    redriven: &HashSet<LetterId>,
) -> Result<Vec<DeadLetter>, DlqError> {
    let mut newest: Vec<DeadLetter> = vec![];
    for letter in letters.into_iter().filter(|l| l.event_id.is_some()) {
        match newest.iter_mut().find(|l| l.event_id == letter.event_id) {
            Some(older) => *older = letter,
            None => newest.push(letter),
        }
    }
    // Stable: letters without an origin keep their reading order, first.
    newest.sort_by_cached_key(DeadLetter::origin);
    match selection {
        Selection::All => {
            newest.retain(|l| !redriven.contains(&(l.topic.clone(), l.partition, l.offset)));
            Ok(newest)
        }
        Selection::EventId(id) => {
            newest.retain(|l| l.event_id == Some(id));
            if newest.is_empty() {
                Err(DlqError::UnknownEventId {
                    consumer: consumer.to_owned(),
                    event_id: id,
                })
            } else {
                Ok(newest)
            }
        }
    }
}

/// Sends each of `letters` to `config`'s consumer's redrive topic of the topic it was consumed
/// from ([`DeadLetter::redrive_topic`]), with its original key, value and headers (plus its
/// origin, `redrive.origin.*`), partitioned by key, through an idempotent producer, waiting
/// for each acknowledgement in turn and then recording the letter as redriven in `pool`
/// ([`record::record`]). Checks first that every redrive topic needed exists.
///
/// # Errors
/// [`DlqError::NoSourceTopic`] for a letter that does not say where it came from and
/// [`DlqError::NoRedriveTopic`] for a redrive topic the broker does not have (nothing is sent
/// then), [`DlqError::Kafka`] when the broker did not acknowledge a message,
/// [`DlqError::Database`] when a redriven letter could not be recorded (it was sent).
pub async fn redrive(
    config: &RuntimeConfig,
    pool: &PgPool,
    letters: &[DeadLetter],
) -> Result<Vec<Redriven>, DlqError> {
    let mut targets = Vec::with_capacity(letters.len());
    for letter in letters {
        let Some(topic) = letter.redrive_topic(config) else {
            return Err(DlqError::NoSourceTopic {
                topic: letter.topic.clone(),
                partition: letter.partition,
                offset: letter.offset,
            });
        };
        targets.push(topic);
    }
    let mut cfg = dead_letter_producer_config(config);
    cfg.set("client.id", format!("{}-redrive", config.consumer_name));
    let producer: FutureProducer = cfg.create()?;
    let mut distinct = targets.clone();
    distinct.sort();
    distinct.dedup();
    let checker = producer.clone();
    match tokio::task::spawn_blocking(move || missing_topic(&checker, &distinct)).await {
        Ok(Ok(None)) => {}
        Ok(Ok(Some(topic))) => return Err(DlqError::NoRedriveTopic { topic }),
        Ok(Err(e)) => return Err(e.into()),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
    let mut sent = vec![];
    for (letter, topic) in letters.iter().zip(&targets) {
        let mut headers = OwnedHeaders::new();
        for (k, v) in letter.original_headers() {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let origin = letter.origin();
        if let Some((topic, partition, offset)) = &origin {
            for (k, v) in [
                (REDRIVE_ORIGIN_TOPIC, topic.clone()),
                (REDRIVE_ORIGIN_PARTITION, partition.to_string()),
                (REDRIVE_ORIGIN_OFFSET, offset.to_string()),
            ] {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
        }
        let mut message: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(k) = letter.key.as_deref() {
            message = message.key(k);
        }
        if let Some(v) = letter.payload.as_deref() {
            message = message.payload(v);
        }
        let delivery = producer
            .send(message, Timeout::After(SEND_TIMEOUT))
            .await
            .map_err(|(e, _)| e)?;
        let (partition, offset) = (delivery.partition, delivery.offset);
        tracing::info!(
            event.id = ?letter.event_id,
            kafka.topic = %topic,
            kafka.partition = partition,
            kafka.offset = offset,
            "Redrove a dead letter to its consumer's redrive topic"
        );
        let landed = Redriven {
            event_id: letter.event_id,
            topic: topic.clone(),
            partition,
            offset,
        };
        record::record(pool, &config.consumer_name, letter, &landed).await?;
        sent.push(landed);
    }
    Ok(sent)
}

/// The first of `topics` the broker does not list (with partitions), if any. Blocking.
fn missing_topic(
    producer: &FutureProducer,
    topics: &[String],
) -> Result<Option<String>, KafkaError> {
    for topic in topics {
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            return Ok(Some(topic.clone()));
        }
    }
    Ok(None)
}
