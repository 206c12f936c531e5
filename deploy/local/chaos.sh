#!/usr/bin/env bash
#
# deploy/local/chaos.sh [chaos flags]: the chaos run (what `make chaos` runs).
#
#  1. installs what is missing (PostgreSQL's binaries, Apache Kafka's jars, the Python venv);
#  2. builds the workspace's binaries (debug, like the test suite);
#  3. runs the `chaos` binary with the given flags (--rate, --duration-s, --seed, --faults,
#     --mix, --lag-threshold, --json FILE; see `chaos --help`): the whole system under load
#     through the fault schedule, then drained and audited with outbox-audit. The summary
#     (fault timeline, recovery per fault, the audit's counts) goes to stdout; progress to
#     stderr. Exit 0 only with a clean audit and every fault recovered.
#
# It starts a private PostgreSQL and a private Apache Kafka broker (deploy/local/kafka-broker.sh)
# because its faults stop and restart them (SIGKILL of the broker's JVM, then a start on the same
# storage): DATABASE_URL / KAFKA_BROKERS are not used.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TARGET="${CARGO_TARGET_DIR:-target}"

bash deploy/local/install-deps.sh
# Release builds: what users run, and half the CPU of the debug ones, so that the load and the
# faults, not the build profile, decide what a 2-core machine can take. (The CI-sized run in
# the test suite uses the debug builds.)
cargo build --release --workspace --bins
export E2E_PROFILE=release
exec "$TARGET/release/chaos" "$@"
