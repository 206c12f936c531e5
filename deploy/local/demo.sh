#!/usr/bin/env bash
#
# deploy/local/demo.sh: the relay end to end on local defaults (what `make demo` runs).
#
#  1. installs what is missing and starts PostgreSQL + Apache Kafka (deploy/local/up.sh), unless
#     DATABASE_URL / KAFKA_BROKERS point at your own servers;
#  2. applies the outbox schema (`outbox-relay migrate`);
#  3. writes a stream of events from 8 concurrent transactions for 10 s (pgbench,
#     deploy/local/demo-writes.sql) while the relay publishes them;
#  4. shows `outbox-relay status` falling to zero and the events on the broker, read back
#     with an independent client (kafka-python);
#  5. runs the order service with its own relay: duplicate orders and callbacks, a cancel, a
#     refund with out-of-order notifications, and the outcome on the service and the broker
#     (deploy/local/demo-orders.sh);
#  6. runs the whole system: order-service, wms-consumer and stock-consumer with one relay per
#     database; forward flow, refunds before/after shipping, a closed refund, an order without
#     stock; ends with a consistency summary (deploy/local/demo-fulfilment.sh);
#  7. drives a short marketplace flow: the marketplace simulator pushes trades and refunds with
#     duplicates, new msg_ids, out-of-order snapshots and drops; one compensation pass; ship-backs
#     (deploy/local/demo-marketplace.sh);
#  8. stops everything it started.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE_DIR="${STATE_DIR:-target/demo-env}"
DURATION="${DEMO_SECONDS:-10}"

# The demo's callback and marketplace secrets are published in these scripts: the services
# refuse such secrets unless this development flag is set (docs/src/security.md: "Secrets").
export ALLOW_WEAK_SECRETS=true

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

bash deploy/local/install-deps.sh
cleanup() {
    kill "${RELAY_PID:-}" 2>/dev/null || true
    for p in "$STATE_DIR"/order-service.pid "$STATE_DIR"/orders-relay.pid "$STATE_DIR"/f-*.pid "$STATE_DIR"/m-*.pid; do
        [[ -f "$p" ]] && kill "$(cat "$p")" 2>/dev/null || true
    done
    bash deploy/local/down.sh "$STATE_DIR" >/dev/null 2>&1 || true
}
trap cleanup EXIT
TOPICS="outbox.event.order" bash deploy/local/up.sh "$STATE_DIR"
# shellcheck disable=SC1091
. "$STATE_DIR/env.sh"
export DATABASE_URL KAFKA_BROKERS PYTHON STATE_DIR

say "Building"
cargo build --release -p outbox-relay -p order-service -p wms-consumer -p stock-consumer -p marketplace-sim
RELAY=target/release/outbox-relay
PGBENCH="$PG_BIN_DIR/pgbench"

say "Applying the outbox schema"
$RELAY migrate
psql -q "$DATABASE_URL" -c "CREATE TABLE IF NOT EXISTS demo_orders (id int PRIMARY KEY, version int NOT NULL)"

say "Starting the relay (metrics on 127.0.0.1:9187)"
$RELAY run --metrics-addr 127.0.0.1:9187 >"$STATE_DIR/relay.log" 2>&1 &
RELAY_PID=$!

say "Writing events from 8 concurrent transactions for ${DURATION}s (pgbench)"
"$PGBENCH" -n -c 8 -j 2 -T "$DURATION" -f deploy/local/demo-writes.sql "$DATABASE_URL" 2>&1 \
    | grep -E 'number of transactions actually processed|tps' || true
$RELAY status

say "Waiting for the backlog to drain"
for _ in $(seq 1 120); do
    left=$($RELAY status --json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["unpublished"])')
    echo "unpublished: $left"
    [[ "$left" == 0 ]] && break
    sleep 1
done
$RELAY status
[[ "$left" == 0 ]] || { echo "backlog did not drain; relay log:"; tail -20 "$STATE_DIR/relay.log"; exit 1; }

say "What landed on the broker (read with kafka-python)"
"$PYTHON" tests/tools/kafka_tool.py dump --brokers "$KAFKA_BROKERS" --topic outbox.event.order >"$STATE_DIR/topic.jsonl"
"$PYTHON" - "$STATE_DIR/topic.jsonl" <<'PY'
import json, sys, collections
msgs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ids = collections.Counter(m["headers"]["event_id"] for m in msgs)
per_part = collections.Counter(m["partition"] for m in msgs)
print(f"messages: {len(msgs)}  distinct events: {len(ids)}  duplicates: {sum(ids.values()) - len(ids)}")
print("per partition:", dict(sorted(per_part.items())))
m = msgs[-1]
print("last message:", json.dumps({"key": m["key"], "headers": m["headers"], "value": json.loads(m["value"])}, indent=2))
PY
curl -s 127.0.0.1:9187/metrics | grep -E '^outbox_(events_published_total|backlog_events|relay_leader)' || true

say "Stopping the relay (SIGTERM)"
kill -TERM "$RELAY_PID"
wait "$RELAY_PID" && echo "relay exited cleanly"
RELAY_PID=
tail -3 "$STATE_DIR/relay.log"

bash deploy/local/demo-orders.sh
bash deploy/local/demo-fulfilment.sh
bash deploy/local/demo-marketplace.sh
