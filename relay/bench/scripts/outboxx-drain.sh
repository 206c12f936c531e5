#!/bin/bash
# Outboxx (a PostgreSQL -> Kafka CDC reader in Zig) draining a WAL backlog of N outbox-shaped
# rows, for comparison with `relay-bench --phases drain` on the same servers: the same row count,
# keys (10 000 aggregates), payload (~300 bytes of JSON) and partitions (6). Prints the drain's
# rate and CPU per event of the Outboxx process and of the whole PostgreSQL server (its WAL
# sender decodes the backlog), as the bench accounts the relay and PostgreSQL.
#
# Usage: outboxx-drain.sh <label>
#   DATABASE_URL   admin URL of a PostgreSQL with wal_level=logical (deploy/local/up.sh's)
#   KAFKA_BROKERS  plaintext bootstrap servers
#   PG_DATADIR     the server's data directory (its postmaster.pid names the process tree)
#   PYTHON         a Python with kafka-python (deploy/local/install-deps.sh's venv)
#   OUTBOXX_BIN    the outboxx binary; N events (default 200000)
#
# Building Outboxx on Debian without network access to Zig's package hosts: Zig 0.16 from PyPI
# (`pip install ziglang==0.16.0`), `apt-get install libpq-dev librdkafka-dev`, then each
# dependency its build.zig.zon names (and theirs) checked out at the named commit into
# `zig-pkg/<hash>/` of the Outboxx checkout, where Zig 0.16 looks before fetching; protobuf's
# lazily fetched `protoc` archive is not needed for the build (an empty `include/` will do);
# `python -m ziglang build -Doptimize=ReleaseFast`.
set -euo pipefail
L=${1:?a label}; N=${N:-200000}
WORK=$(mktemp -d)
ADMIN=$DATABASE_URL; DB=obx_$L; URL=${ADMIN%/*}/$DB
T=obx.$L.orders
psql "$ADMIN" -qAtc "drop database if exists $DB" -c "create database $DB" >/dev/null
psql "$URL" -qAt <<SQL
create table orders_outbox (id bigserial primary key, aggregate_id text not null, event_type text not null, payload jsonb not null);
SQL
$PYTHON - <<PY
from kafka.admin import KafkaAdminClient, NewTopic
a = KafkaAdminClient(bootstrap_servers="$KAFKA_BROKERS")
a.create_topics([NewTopic("$T", 6, 1)])
PY
cat > "$WORK/config.toml" <<TOML
[metadata]
version = "v0"
[source]
type = "postgres"
[source.postgres]
connection_env = "POSTGRES_URL"
slot_name = "obx_$L"
publication_name = "obx_pub_$L"
[sink]
type = "kafka"
[sink.kafka]
brokers = ["$KAFKA_BROKERS"]
tls = false
[[streams]]
name = "orders"
[streams.source]
resource = "orders_outbox"
operations = ["insert"]
[streams.flow]
format = "json"
[streams.sink]
destination = "$T"
routing_key = "aggregate_id"
TOML
export POSTGRES_URL="$URL"
OB=${OUTBOXX_BIN:?the outboxx binary}
# First start: slot and publication; then stop it and build the backlog behind the slot.
$OB --config "$WORK/config.toml" > "$WORK/first.log" 2>&1 & P=$!
streaming() { psql "$URL" -qAtc "select count(*) from pg_replication_slots where slot_name = 'obx_$L' and active"; }
for _ in $(seq 1 150); do [ "$(streaming)" = 1 ] && break; sleep 0.2; done
[ "$(streaming)" = 1 ] || { echo "outboxx did not start streaming within 30 s:" >&2; cat "$WORK/first.log" >&2; exit 1; }
kill -TERM $P; wait $P || true
psql "$URL" -qAt -c "insert into orders_outbox (aggregate_id, event_type, payload) select (g % 10000)::text, 'OrderPaid', jsonb_build_object('pad', repeat('x', 237), 'currency', 'EUR', 'order_id', g::text, 'amount_cents', (g * 37) % 100000) from generate_series(1, $N) g"
psql "$URL" -qAtc "checkpoint" >/dev/null
PM=$(head -1 "$PG_DATADIR/postmaster.pid")
tree() { local s=0; for p in $PM $(pgrep -P $PM); do s=$((s + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done; echo $s; }
PG0=$(tree); T0=$(date +%s.%N)
$OB --config "$WORK/config.toml" > "$WORK/outboxx.log" 2>&1 & P=$!
$PYTHON - <<PY
import time, os, sys
from kafka import KafkaConsumer, TopicPartition
c = KafkaConsumer(bootstrap_servers="$KAFKA_BROKERS")
ps = [TopicPartition("$T", p) for p in range(6)]
deadline = time.monotonic() + 600
while sum(c.end_offsets(ps).values()) < $N:
    if time.monotonic() > deadline:
        sys.exit("the topic did not reach $N messages within 600 s")
    try:
        os.kill($P, 0)
    except OSError:
        sys.exit("outboxx exited")
    time.sleep(0.1)
PY
T1=$(date +%s.%N); PG1=$(tree); OBT=$(awk '{print $14+$15}' /proc/$P/stat)
HZ=$(getconf CLK_TCK)
kill -TERM $P; wait $P || true
python3 -c "
n=$N; t=$T1-$T0; ob=$OBT/$HZ; pg=($PG1-$PG0)/$HZ
print(f'$L: {n} events in {t:.2f} s = {n/t:.0f}/s; outboxx {ob*1e6/n:.2f} us/event, postgres (whole server) {pg*1e6/n:.2f} us/event, together {(ob+pg)*1e6/n:.2f}')
"
psql "$URL" -qAtc "select pg_drop_replication_slot('obx_$L')" >/dev/null
