#!/usr/bin/env python3
"""kafka_tool.py: an independent Kafka client for checking what the relay did.

It uses kafka-python (pure Python, no librdkafka), so it shares no code with the
Rust relay (rdkafka) it checks. Run it with the venv python that
deploy/local/install-deps.sh sets up ($PYTHON in target/local-env/env.sh).

Subcommands:

  ready --brokers B [--timeout S] [--pid PID]
      Waits until the broker answers a metadata request (a started JVM accepts
      connections before it serves them): exit 0 and {"brokers": [...]} once it
      does, 1 at the timeout (default 60 s) or as soon as process PID is gone.

  create-topics --brokers B --partitions N [--replication-factor R] [--config K=V ...] TOPIC...
      Creates the topics, with topic-level configs (e.g. max.message.bytes=2048,
      min.insync.replicas=2); a topic that already exists is not an error. Waits
      until the broker's metadata shows each topic, and prints one JSON line per
      topic: {"topic", "partitions", "created"}.

  dump --brokers B --topic T [--topic T2 ...] [--expect N] [--idle-timeout S] [--timeout S]
      Reads the topics from the beginning (no consumer group: every partition is
      assigned by hand, nothing is committed) and prints one JSON object per
      message and line:
        {"topic", "partition", "offset", "key", "headers": {name: value},
         "value", "timestamp"}
      key, header values and value are decoded as UTF-8 (invalid bytes become
      U+FFFD; a null key/value is JSON null, a header without a value reads as "");
      timestamp is in ms.
      --bytes adds "key_hex" and "value_hex" (the exact bytes, null when absent) and
      "header_list" ([name, hex or null] in the message's order);
      --cloudevents adds "cloudevent": the message as the cloudevents SDK's Kafka
      binding reads it in binary mode ({"attributes", "data_hex", "problems"},
      or {"error"} when the SDK refuses it).
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

# Security: the same environment variables as the project's binaries
# (KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME,
# KAFKA_SASL_PASSWORD / KAFKA_SASL_PASSWORD_FILE, KAFKA_SSL_CA_LOCATION,
# KAFKA_SSL_CERTIFICATE_LOCATION / KAFKA_SSL_KEY_LOCATION); host names are checked.

# Written for kafka-python 3.0.x (pinned in deploy/local/lib.sh); 3.x renamed
# some settings (e.g. bootstrap_timeout_ms) and reworked the admin client.
#
# Broker versions: kafka-python sends ApiVersions at connect time and derives a
# "broker version" from the answer, then picks the request versions it serves
# (Apache Kafka 4.x: kafka-python 3.0.12 speaks to it without a pin).
# KAFKA_TOOL_API_VERSION=3.9.0 (say) pins it anyway, as an escape hatch for other brokers.


def compat_settings(timeout):
    """Settings every client gets; timeout (seconds) bounds the first connect."""
    settings = {
        "client_id": "outbox-kafka-tool",
        "request_timeout_ms": 30000,
        # Fail within our own --timeout when the broker is unreachable, not
        # after kafka-python's default 30 s.
        "bootstrap_timeout_ms": max(1000, int(timeout * 1000)),
    }
    pinned = os.environ.get("KAFKA_TOOL_API_VERSION")
    if pinned:
        settings["api_version"] = tuple(int(x) for x in pinned.split("."))
    settings.update(security_settings(os.environ))
    return settings


def security_settings(env):
    """kafka-python's TLS and SASL settings from the environment variables every binary of the
    project reads (KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*, KAFKA_SSL_*), so a test gives the
    independent client exactly what it gives the relay and the consumers."""
    protocol = (env.get("KAFKA_SECURITY_PROTOCOL") or "").upper()
    if not protocol or protocol == "PLAINTEXT":
        return {}
    settings = {"security_protocol": protocol}
    if protocol.startswith("SASL_"):
        password = env.get("KAFKA_SASL_PASSWORD")
        if env.get("KAFKA_SASL_PASSWORD_FILE"):
            with open(env["KAFKA_SASL_PASSWORD_FILE"], encoding="utf-8") as f:
                password = f.read().rstrip("\r\n")
        settings.update(
            sasl_mechanism=env.get("KAFKA_SASL_MECHANISM", "PLAIN").upper(),
            sasl_plain_username=env.get("KAFKA_SASL_USERNAME"),
            sasl_plain_password=password,
        )
    if protocol.endswith("SSL"):
        settings["ssl_check_hostname"] = True
        if env.get("KAFKA_SSL_CA_LOCATION"):
            settings["ssl_cafile"] = env["KAFKA_SSL_CA_LOCATION"]
        if env.get("KAFKA_SSL_CERTIFICATE_LOCATION"):
            settings["ssl_certfile"] = env["KAFKA_SSL_CERTIFICATE_LOCATION"]
            settings["ssl_keyfile"] = env.get("KAFKA_SSL_KEY_LOCATION")
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
    settings = compat_settings(args.timeout)
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
                            topic_configs=dict(args.config),
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


# --- ready -------------------------------------------------------------------


def cmd_ready(args):
    deadline = time.monotonic() + args.timeout
    last = None
    while True:
        if args.pid is not None and not pid_alive(args.pid):
            raise KafkaError(f"the broker process {args.pid} exited before it served metadata ({last})")
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaError(f"no metadata answer from {','.join(args.brokers)} within {args.timeout}s ({last})")
        try:
            settings = compat_settings(min(left, 5.0))
            consumer = KafkaConsumer(bootstrap_servers=args.brokers, group_id=None, **settings)
            try:
                consumer.topics()  # a metadata request, answered
                brokers = sorted(f"{b.host}:{b.port}" for b in consumer._client.cluster.brokers())
            finally:
                consumer.close()
            if brokers:
                emit({"brokers": brokers})
                return 0
            last = "metadata listed no broker"
        except (KafkaError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)


def pid_alive(pid):
    """True while process pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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
        **compat_settings(args.timeout),
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

        def end_offsets():
            # Bounded by what is left of --timeout: an unreachable broker is an
            # error, not a quiet "read 0 messages".
            left_ms = int((deadline - time.monotonic()) * 1000)
            return consumer.end_offsets(tps, timeout_ms=max(1000, left_ms))

        def caught_up(end):
            return all(consumer.position(tp) >= end[tp] for tp in tps)

        end = end_offsets()
        final_end = None
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
                    record = {
                        "topic": rec.topic,
                        "partition": rec.partition,
                        "offset": rec.offset,
                        "key": decode(rec.key),
                        # A header without a value reads as "" here; --bytes gives
                        # header_list, in order, with null for it.
                        "headers": {k: decode(v) or "" for k, v in (rec.headers or [])},
                        "value": decode(rec.value),
                        "timestamp": rec.timestamp,
                    }
                    if args.bytes:
                        record["key_hex"] = None if rec.key is None else bytes(rec.key).hex()
                        record["value_hex"] = (
                            None if rec.value is None else bytes(rec.value).hex()
                        )
                        record["header_list"] = [
                            [k, None if v is None else bytes(v).hex()]
                            for k, v in (rec.headers or [])
                        ]
                    if args.cloudevents:
                        record["cloudevent"] = cloudevent_of(rec)
                    emit(record)
                    count += 1
                    last_message = time.monotonic()

            if args.expect is not None and count >= args.expect:
                # Enough: read on only up to the end offsets of this moment, so
                # extra messages (duplicates) already there show up too, but a
                # producer that keeps going cannot keep us here.
                if final_end is None:
                    final_end = end_offsets()
                if caught_up(final_end):
                    reason = "expected count reached"
                    break
                continue
            if not caught_up(end):
                continue
            # Everything up to the last known end offsets is read: ask for new ones.
            end = end_offsets()
            if not caught_up(end):
                continue
            if idle_timeout is not None and time.monotonic() - last_message >= idle_timeout:
                reason = "idle"
                break
    finally:
        consumer.close()

    expected = f" (expected {args.expect})" if args.expect is not None else ""
    info(
        f"dump: read {count} messages{expected} from {len(args.topics)} topic(s); stopped: {reason}; "
        f"{time.monotonic() - start:.2f}s"
    )
    return 0


def cloudevent_of(rec):
    """The message read back as a binary-mode CloudEvent by the cloudevents SDK's Kafka binding
    (an implementation independent of the relay): its attributes, its data (hex, null for a
    tombstone) and what does not conform; or the SDK's error."""
    import datetime

    from cloudevents.kafka import KafkaMessage, from_binary

    headers = {k: bytes(v or b"") for k, v in (rec.headers or [])}
    try:
        event = from_binary(
            KafkaMessage(headers=headers, key=rec.key, value=rec.value),
            data_unmarshaller=lambda v: v,
        )
    except Exception as e:  # the SDK's refusal is the answer
        return {"error": f"{type(e).__name__}: {e}"}
    attributes = {}
    for name, value in event.get_attributes().items():
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", errors="replace")
        attributes[name] = value if isinstance(value, str) else str(value)
    problems = []
    if attributes.get("specversion") != "1.0":
        problems.append(f"specversion {attributes.get('specversion')!r}")
    for required in ("id", "source", "type"):
        if not attributes.get(required):
            problems.append(f"no {required}")
    try:
        datetime.datetime.fromisoformat(attributes.get("time", ""))
    except ValueError:
        problems.append(f"time {attributes.get('time')!r} is not RFC 3339")
    data = event.get_data()
    return {
        "attributes": attributes,
        "data_hex": None if data is None else bytes(data).hex(),
        "problems": problems,
    }


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
        # send() blocks for metadata up to max_block_ms (default 60 s), e.g.
        # for a topic that does not exist (our brokers never auto-create topics).
        max_block_ms=max(1000, int(args.timeout * 1000)),
        **compat_settings(args.timeout),
    )
    try:
        if not producer.partitions_for(args.topic):
            raise KafkaError(f"unknown topic {args.topic!r}")
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
        sp.add_argument(
            "--brokers",
            type=brokers_list,
            default=os.environ.get("KAFKA_BROKERS"),
            required="KAFKA_BROKERS" not in os.environ,
            help="host:port[,host:port] (default $KAFKA_BROKERS)",
        )

    c = sub.add_parser("create-topics", help="create topics (existing ones are fine)")
    brokers_arg(c)
    c.add_argument("--partitions", type=int, required=True)
    c.add_argument("--replication-factor", type=int, default=1)
    c.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    c.add_argument(
        "--config", type=parse_header, action="append", default=[], metavar="NAME=VALUE",
        help="a topic-level config (repeatable)",
    )
    c.add_argument("topics", nargs="+", metavar="TOPIC")
    c.set_defaults(func=cmd_create_topics)

    r = sub.add_parser("ready", help="wait until the broker answers a metadata request")
    brokers_arg(r)
    r.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    r.add_argument("--pid", type=int, help="fail at once when this process is gone")
    r.set_defaults(func=cmd_ready)

    d = sub.add_parser("dump", help="print all messages of topics as JSON lines")
    brokers_arg(d)
    d.add_argument("--topic", dest="topics", action="append", required=True, metavar="TOPIC")
    d.add_argument("--expect", type=int, help="stop once this many messages were read")
    d.add_argument(
        "--bytes", action="store_true", help="also print key_hex and value_hex (exact bytes)"
    )
    d.add_argument(
        "--cloudevents",
        action="store_true",
        help="also read each message as a binary-mode CloudEvent with the cloudevents SDK",
    )
    d.add_argument(
        "--idle-timeout",
        type=float,
        help="stop when caught up and nothing new came for this many seconds "
        "(default 1, or no limit with --expect)",
    )
    d.add_argument("--timeout", type=float, default=60.0, help="overall limit in seconds (default 60)")
    d.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_committed",
        help="default read_committed, as the relay's consumers must read (its batches are Kafka transactions)",
    )
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


class OncePerMessage(logging.Filter):
    """Lets each distinct log message through once: kafka-python repeats the
    same error (e.g. "Topic x not found in cluster metadata") on every retry."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record):
        key = (record.name, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def main(argv=None):
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if not args.verbose:
        handler.addFilter(OncePerMessage())
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.ERROR, handlers=[handler])
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except (KafkaError, OSError, ValueError) as exc:
        msg = str(exc)
        if not msg.startswith(type(exc).__name__):
            msg = f"{type(exc).__name__}: {msg}"
        info(f"error: {msg}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
