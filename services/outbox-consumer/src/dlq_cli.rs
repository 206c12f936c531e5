//! `dlq list` and `dlq redrive`: the dead-letter commands every consuming binary offers, parsed
//! and run here once ([`ConsumerCommand`], [`run`]); a binary adds
//! `#[command(subcommand)] command: Option<ConsumerCommand>` to its configuration and runs the
//! service when there is none.
//!
//! Output goes to stdout, as text or (`--json`) one JSON document; errors go to the caller,
//! which exits non-zero with the message (e.g. an event id no dead letter of this consumer has).

use std::io::Write;

use std::collections::HashSet;

use sqlx::PgPool;
use uuid::Uuid;

use super::redrive::{self, record, DeadLetter, DlqError, Redriven, Selection};
use super::RuntimeConfig;

/// Operator commands of a consuming service.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum ConsumerCommand {
    /// The consumer's dead letters (`<topic>.dlq` of each consumed topic).
    #[command(subcommand)]
    Dlq(DlqCommand),
}

/// `dlq` subcommands.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum DlqCommand {
    /// Lists this consumer's dead letters: event id, source topic/partition/offset, reason,
    /// time, the redrive topic `dlq redrive` would send it to, error. Reads up to the current
    /// end without committing any consumer group.
    List {
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Sends dead letters back to this consumer alone, through its redrive topic
    /// `<topic>.<consumer>.redrive` (original key, value and headers, without the `dlq.*`
    /// headers), and waits for the broker's acks; other consumers of the topic never see them
    /// again. Each redriven letter is recorded in the consumer's database (`dlq_redriven`);
    /// `--all` never sends a recorded letter again.
    Redrive(RedriveArgs),
}

/// Which letters `dlq redrive` sends.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["event_id", "all"])))]
pub struct RedriveArgs {
    /// The event to redrive (its newest dead letter).
    #[arg(long)]
    pub event_id: Option<Uuid>,
    /// Every dead letter of this consumer not redriven yet (the newest per event, in the order
    /// the events were first consumed; letters without an event id are skipped).
    #[arg(long)]
    pub all: bool,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `command` for the consumer of `config` (whose database `pool` records what was
/// redriven: `dlq_redriven`, migrated with the inbox), writing its output to `out`.
///
/// # Errors
/// A [`DlqError`]: the broker is unreachable, a read timed out, an unknown event id, or a
/// redrive the broker did not acknowledge. Output written before the error stays written.
pub async fn run(
    command: &ConsumerCommand,
    config: &RuntimeConfig,
    pool: &PgPool,
    out: &mut impl Write,
) -> Result<(), DlqError> {
    let ConsumerCommand::Dlq(dlq) = command;
    let letters = {
        let config = config.clone();
        match tokio::task::spawn_blocking(move || redrive::read_dead_letters(&config)).await {
            Ok(read) => read?,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    };
    match dlq {
        DlqCommand::List { json } => print_list(out, config, &letters, *json),
        DlqCommand::Redrive(args) => {
            let consumer = &config.consumer_name;
            let (selection, redriven) = match args.event_id {
                Some(id) => (Selection::EventId(id), HashSet::new()),
                None => (Selection::All, record::redriven(pool, consumer).await?),
            };
            let skipped = letters
                .iter()
                .filter(|l| redriven.contains(&(l.topic.clone(), l.partition, l.offset)))
                .count();
            let chosen = redrive::select(letters, selection, consumer, &redriven)?;
            let sent = redrive::redrive(config, pool, &chosen).await?;
            print_redriven(out, consumer, &sent, skipped, args.json)
        }
    }
    .map_err(DlqError::Output)
}

fn print_list(
    out: &mut impl Write,
    config: &RuntimeConfig,
    letters: &[DeadLetter],
    json: bool,
) -> std::io::Result<()> {
    let consumer = &config.consumer_name;
    if json {
        let doc = serde_json::json!({
            "consumer": consumer,
            "dead_letters": letters.iter().map(|l| l.to_json(config)).collect::<Vec<_>>(),
        });
        return writeln!(out, "{doc}");
    }
    writeln!(
        out,
        "{} dead letter(s) of consumer {consumer}",
        letters.len()
    )?;
    for l in letters {
        writeln!(
            out,
            "{} {}/{}@{} {} {} redrive->{} {}",
            l.event_id
                .map_or_else(|| "-".to_owned(), |id| id.to_string()),
            l.source_topic.as_deref().unwrap_or("-"),
            l.source_partition
                .map_or_else(|| "-".to_owned(), |p| p.to_string()),
            l.source_offset
                .map_or_else(|| "-".to_owned(), |o| o.to_string()),
            l.reason,
            l.dead_lettered_at
                .map_or_else(|| "-".to_owned(), |t| t.to_rfc3339()),
            l.redrive_topic(config).as_deref().unwrap_or("-"),
            l.error,
        )?;
    }
    Ok(())
}

fn print_redriven(
    out: &mut impl Write,
    consumer: &str,
    sent: &[Redriven],
    skipped: usize,
    json: bool,
) -> std::io::Result<()> {
    if json {
        let redriven: Vec<serde_json::Value> = sent
            .iter()
            .map(|r| {
                serde_json::json!({
                    "event_id": r.event_id,
                    "topic": r.topic,
                    "partition": r.partition,
                    "offset": r.offset,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "consumer": consumer,
            "redriven": redriven,
            "already_redriven": skipped,
        });
        return writeln!(out, "{doc}");
    }
    writeln!(
        out,
        "Redrove {} dead letter(s) of consumer {consumer} to its redrive topic(s); no other consumer receives them",
        sent.len()
    )?;
    if skipped > 0 {
        writeln!(
            out,
            "Left out {skipped} dead letter(s) redriven before (dlq_redriven)"
        )?;
    }
    for r in sent {
        writeln!(
            out,
            "{} -> {}/{}@{}",
            r.event_id
                .map_or_else(|| "-".to_owned(), |id| id.to_string()),
            r.topic,
            r.partition,
            r.offset
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Option<ConsumerCommand>,
    }

    fn parse(args: &[&str]) -> Result<Option<ConsumerCommand>, clap::Error> {
        let mut argv = vec!["svc"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|c| c.command)
    }

    #[test]
    fn no_subcommand_runs_the_service_and_dlq_commands_parse() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(
            parse(&["dlq", "list", "--json"]).unwrap(),
            Some(ConsumerCommand::Dlq(DlqCommand::List { json: true }))
        );
        let id = Uuid::new_v4();
        assert_eq!(
            parse(&["dlq", "redrive", "--event-id", &id.to_string()]).unwrap(),
            Some(ConsumerCommand::Dlq(DlqCommand::Redrive(RedriveArgs {
                event_id: Some(id),
                all: false,
                json: false
            })))
        );
        assert!(parse(&["dlq", "redrive"]).is_err(), "--event-id or --all");
        assert!(parse(&["dlq", "redrive", "--all", "--event-id", &id.to_string()]).is_err());
        assert!(parse(&["dlq", "redrive", "--event-id", "nope"]).is_err());
    }
}
