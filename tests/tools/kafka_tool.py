#!/usr/bin/env python3
"""kafka_tool.py: an independent Kafka client for checking what the relay did.

It uses kafka-python (pure Python, no librdkafka), so it shares no code with the
Rust relay (rdkafka) it checks. Run it with the venv python that
deploy/local/install-deps.sh sets up ($PYTHON in target/local-env/env.sh).

Subcommands:

  create-topics --brokers B --partitions N [--replication-factor R] TOPIC...
      Creates the topics; a topic that already exists is not an error. Waits
      until the broker's metadata shows each topic, and prints one JSON line per
      topic: {"topic", "partitions", "created"}.

  dump --brokers B --topic T [--topic T2 ...] [--expect N] [--idle-timeout S] [--timeout S]
      Reads the topics from the beginning (no consumer group: every partition is
      assigned by hand, nothing is committed) and prints one JSON object per
      message and line:
        {"topic", "partition", "offset", "key", "headers": {name: value},
         "value", "timestamp"}
      key, header values and value are decoded as UTF-8 (invalid bytes become
      U+FFFD; a null key/value/header value is JSON null); timestamp is in ms.
      Within a partition lines come in offset order; partitions interleave.
      It knows from the partitions' end offsets when it has read everything
      available, so it never stops early just because a fetch was slow. It stops:
        - with --expect N: once N messages were read and everything available at
          that moment is read too (so duplicates beyond N are shown, not hidden);
        - when it has read everything available and no new message arrived for
          --idle-timeout seconds (default 1 without --expect, no limit with it;
          0 = stop as soon as everything available is read);
        - at --timeout seconds overall (default 60).
      A summary goes to stderr. The exit code is 0 also when fewer than N
      messages arrived (compare the output); non-zero only on errors (unknown
      topic, broker unreachable, ...).

  produce --brokers B --topic T --key K --value V [--header k=v ...] [--partition P]
      Produces one message (acks=all) and prints {"topic", "partition", "offset"}.
      --null-key sends no key.

Exit codes: 0 ok, 1 error, 2 bad usage.
"""

import argparse
import json
import logging
import os
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

# Settings every client gets. kafka-python asks the broker which API versions it
# supports (ApiVersions) and derives a "broker version" from the answer; tansu
# 0.6.0 answers ApiVersions fine, so no api_version pin is needed (see
# compat_settings below for the override).
COMMON = {
    "client_id": "outbox-kafka-tool",
    "request_timeout_ms": 30000,
}


def compat_settings():
    """Extra client settings for the broker at hand.

    KAFKA_TOOL_API_VERSION=2.8.0 (say) pins kafka-python's idea of the broker
    version instead of probing it, as an escape hatch for other brokers.
    """
    settings = dict(COMMON)
    pinned = os.environ.get("KAFKA_TOOL_API_VERSION")
    if pinned:
        settings["api_version"] = tuple(int(x) for x in pinned.split("."))
    return settings


def brokers_list(value):
    return [b.strip() for b in value.split(",") if b.strip()]


def decode(data):
    if data is None:
        return None
    if isinstance(data, str):
        return data
    return bytes(data).decode("utf-8", errors="replace")


def emit(obj):
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def info(msg):
    print(f"kafka_tool: {msg}", file=sys.stderr, flush=True)


# --- create-topics -----------------------------------------------------------


def topic_partitions(consumer, topic, deadline):
    """Partition ids of topic from fresh metadata, or None if unknown by deadline."""
    while True:
        # topics() refreshes the cluster metadata; partitions_for_topic reads it.
        consumer.topics()
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def cmd_create_topics(args):
    settings = compat_settings()
    admin = KafkaAdminClient(bootstrap_servers=args.brokers, **settings)
    created = {}
    try:
        for topic in args.topics:
            # One request per topic: an "already exists" for one topic must not
            # hide the result of the others.
            try:
                admin.create_topics(
                    [
                        NewTopic(
                            name=topic,
                            num_partitions=args.partitions,
                            replication_factor=args.replication_factor,
                        )
                    ],
                    timeout_ms=int(args.timeout * 1000),
                )
                created[topic] = True
            except TopicAlreadyExistsError:
                created[topic] = False
    finally:
        admin.close()

    consumer = KafkaConsumer(bootstrap_servers=args.brokers, group_id=None, **settings)
    try:
        deadline = time.monotonic() + args.timeout
        for topic in args.topics:
            parts = topic_partitions(consumer, topic, deadline)
            if parts is None:
                raise KafkaError(f"topic {topic!r} not visible in metadata after creation")
            if not created[topic] and len(parts) != args.partitions:
                info(f"warning: {topic} already existed with {len(parts)} partitions, not {args.partitions}")
            emit({"topic": topic, "partitions": len(parts), "created": created[topic]})
    finally:
        consumer.close()
    return 0


# --- dump --------------------------------------------------------------------


def cmd_dump(args):
    start = time.monotonic()
    deadline = start + args.timeout
    idle_timeout = args.idle_timeout
    if idle_timeout is None and args.expect is None:
        idle_timeout = 1.0

    consumer = KafkaConsumer(
        bootstrap_servers=args.brokers,
        group_id=None,  # no group: no coordinator, no commits, no rebalances
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=args.isolation_level,
        **compat_settings(),
    )
    count = 0
    try:
        tps = []
        # Wait a little for topics that don't exist yet (the relay may be about
        # to create them), at most the idle timeout or 5 s within the overall one.
        meta_deadline = min(deadline, start + max(idle_timeout or 0, 5.0))
        for topic in args.topics:
            parts = topic_partitions(consumer, topic, meta_deadline)
            if parts is None:
                raise KafkaError(f"unknown topic {topic!r}")
            tps.extend(TopicPartition(topic, p) for p in parts)
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)

        end = consumer.end_offsets(tps)
        last_message = time.monotonic()
        reason = "timeout"
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            wait_ms = max(1, min(200, int((deadline - now) * 1000)))
            batches = consumer.poll(timeout_ms=wait_ms, max_records=1000)
            for tp in sorted(batches, key=lambda t: (t.topic, t.partition)):
                for rec in batches[tp]:
                    emit(
                        {
                            "topic": rec.topic,
                            "partition": rec.partition,
                            "offset": rec.offset,
                            "key": decode(rec.key),
                            "headers": {k: decode(v) for k, v in (rec.headers or [])},
                            "value": decode(rec.value),
                            "timestamp": rec.timestamp,
                        }
                    )
                    count += 1
                    last_message = time.monotonic()

            def caught_up():
                return all(consumer.position(tp) >= end[tp] for tp in tps)

            if not caught_up():
                continue
            # Everything up to the last known end offsets is read: ask for new ones.
            end = consumer.end_offsets(tps)
            if not caught_up():
                continue
            if args.expect is not None and count >= args.expect:
                reason = "expected count reached"
                break
            if idle_timeout is not None and time.monotonic() - last_message >= idle_timeout:
                reason = "idle"
                break
    finally:
        consumer.close()

    expected = f" (expected {args.expect})" if args.expect is not None else ""
    info(f"dump: read {count} messages{expected} from {len(args.topics)} topic(s); stopped: {reason}; "
         f"{time.monotonic() - start:.2f}s")
    return 0


# --- produce -----------------------------------------------------------------


def parse_header(text):
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"header must be name=value, got {text!r}")
    return name, value


def cmd_produce(args):
    producer = KafkaProducer(
        bootstrap_servers=args.brokers,
        acks="all",
        retries=5,
        **compat_settings(),
    )
    try:
        future = producer.send(
            args.topic,
            key=None if args.null_key else args.key.encode("utf-8"),
            value=args.value.encode("utf-8"),
            headers=[(k, v.encode("utf-8")) for k, v in args.header],
            partition=args.partition,
        )
        meta = future.get(timeout=args.timeout)
        producer.flush(timeout=args.timeout)
    finally:
        producer.close(timeout=5)
    emit({"topic": meta.topic, "partition": meta.partition, "offset": meta.offset})
    return 0


# --- main --------------------------------------------------------------------


def build_parser():
    p = argparse.ArgumentParser(
        prog="kafka_tool.py",
        description="Independent Kafka client (kafka-python) for the outbox relay's tests.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="kafka-python debug logging to stderr")
    sub = p.add_subparsers(dest="command", required=True)

    def brokers_arg(sp):
        sp.add_argument("--brokers", type=brokers_list, default=os.environ.get("KAFKA_BROKERS"),
                        required="KAFKA_BROKERS" not in os.environ,
                        help="host:port[,host:port] (default $KAFKA_BROKERS)")

    c = sub.add_parser("create-topics", help="create topics (existing ones are fine)")
    brokers_arg(c)
    c.add_argument("--partitions", type=int, required=True)
    c.add_argument("--replication-factor", type=int, default=1)
    c.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    c.add_argument("topics", nargs="+", metavar="TOPIC")
    c.set_defaults(func=cmd_create_topics)

    d = sub.add_parser("dump", help="print all messages of topics as JSON lines")
    brokers_arg(d)
    d.add_argument("--topic", dest="topics", action="append", required=True, metavar="TOPIC")
    d.add_argument("--expect", type=int, help="stop once this many messages were read")
    d.add_argument("--idle-timeout", type=float,
                   help="stop when caught up and nothing new came for this many seconds "
                        "(default 1, or no limit with --expect)")
    d.add_argument("--timeout", type=float, default=60.0, help="overall limit in seconds (default 60)")
    d.add_argument("--isolation-level", choices=["read_uncommitted", "read_committed"],
                   default="read_uncommitted")
    d.set_defaults(func=cmd_dump)

    pr = sub.add_parser("produce", help="produce one message")
    brokers_arg(pr)
    pr.add_argument("--topic", required=True)
    key = pr.add_mutually_exclusive_group(required=True)
    key.add_argument("--key")
    key.add_argument("--null-key", action="store_true")
    pr.add_argument("--value", required=True)
    pr.add_argument("--header", type=parse_header, action="append", default=[], metavar="NAME=VALUE")
    pr.add_argument("--partition", type=int, help="default: the producer's partitioner (by key)")
    pr.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    pr.set_defaults(func=cmd_produce)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except (KafkaError, OSError, ValueError) as exc:
        info(f"error: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
