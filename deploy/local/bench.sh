#!/usr/bin/env bash
#
# deploy/local/bench.sh [relay-bench flags]: the relay benchmark (what `make bench` runs).
#
#  1. installs what is missing and starts PostgreSQL + Apache Kafka (single-node KRaft,
#     deploy/local/up.sh), unless DATABASE_URL / KAFKA_BROKERS point at your own servers;
#  2. builds the release relay and relay-bench;
#  3. runs relay-bench with the given flags (e.g. --quick, --batch-size 10000; see
#     `relay-bench --help`): table on stdout, JSON in target/bench/relay-bench.json;
#  4. stops the servers it started.
#
# BENCH_BROKER_PID (set here for the broker this script starts) lets relay-bench account the
# broker's CPU; PostgreSQL's server processes are found from a backend's parent when the
# server runs on this machine.
# BENCH_BROKER_STORAGE names the broker's storage in the results; it is set here for the
# broker this script starts, give it yourself for a broker of your own.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE_DIR="${STATE_DIR:-target/bench-env}"
TARGET="${CARGO_TARGET_DIR:-target}"

own_broker=1
[[ -n "${KAFKA_BROKERS:-}" ]] && own_broker=0

bash deploy/local/install-deps.sh
trap 'bash deploy/local/down.sh "$STATE_DIR" >/dev/null 2>&1 || true' EXIT
TOPICS="" bash deploy/local/up.sh "$STATE_DIR"
# shellcheck disable=SC1091
. "$STATE_DIR/env.sh"
export DATABASE_URL KAFKA_BROKERS
if ((own_broker)); then
    # shellcheck source=deploy/local/lib.sh
    . deploy/local/lib.sh
    export BENCH_BROKER_STORAGE="Apache Kafka $KAFKA_VERSION, KRaft, one node, log on $(df --output=fstype "$STATE_DIR" | tail -n 1)"
    # Lets relay-bench account the broker's CPU per event (PostgreSQL's it finds itself).
    BENCH_BROKER_PID="$(cat "$STATE_DIR/kafka.pid" 2>/dev/null || true)"
    export BENCH_BROKER_PID
else
    export BENCH_BROKER_STORAGE="${BENCH_BROKER_STORAGE:-external (KAFKA_BROKERS)}"
fi

cargo build --release -p outbox-relay -p relay-bench
# The release relay just built, unless the arguments name another (`--relay-bin PATH` or
# `--relay-bin=PATH`: an older build for the "before" of a change).
relay_bin=(--relay-bin "$TARGET/release/outbox-relay")
for arg in "$@"; do
    [[ "$arg" == --relay-bin || "$arg" == --relay-bin=* ]] && relay_bin=()
done
"$TARGET/release/relay-bench" "${relay_bin[@]}" "$@"
