#!/usr/bin/env bash
#
# deploy/local/run-tests.sh: the whole test suite against real servers (what `make test`
# and CI run). Installs what is missing (PostgreSQL, Apache Kafka's jars, the kafka-python venv), starts a
# throwaway PostgreSQL and Apache Kafka broker unless DATABASE_URL / KAFKA_BROKERS are already set,
# builds the binaries the end-to-end tests spawn, runs `cargo test --workspace`, and stops
# the servers it started. Tests that restart a server (broker outage, PostgreSQL restart)
# start private servers of their own from the same binaries.
#
# Before any server starts, the gates: `cargo fmt --check` and clippy with warnings as errors
# (after `install-deps.sh --build-only`: OpenSSL's headers, which the build needs).
#
# TEST_THREADS (default 3) bounds how many tests run at once on this 2-core machine.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE_DIR="${STATE_DIR:-target/test-env}"

# Gates first: formatting and lints fail fast, before servers and the long suite. Clippy
# compiles (build scripts included), so the build's system libraries come first.
cargo fmt --all -- --check
bash deploy/local/install-deps.sh --build-only
cargo clippy --workspace --all-targets -- -D warnings
# Each library crate on its own, with its default features and with each feature it has: the
# workspace build unifies features, which can hide a crate that compiles only with another's.
for crate in outbox-trace:otlp outbox-writer outbox-process outbox-kafka outbox-consumer \
    outbox-http outbox-consumer-service event-contracts test-support:order-api; do
    name="${crate%%:*}"
    cargo clippy -p "$name" --all-targets -- -D warnings
    if [[ "$crate" == *:* ]]; then
        IFS=, read -ra features <<<"${crate#*:}"
        for feature in "${features[@]}"; do
            cargo clippy -p "$name" --features "$feature" --all-targets -- -D warnings
        done
    fi
done

bash deploy/local/install-deps.sh
# The book builds and no link is dead (cheap; before the servers and the long suite).
bash deploy/local/book.sh
trap 'bash deploy/local/down.sh "$STATE_DIR" >/dev/null 2>&1 || true' EXIT
TOPICS="" bash deploy/local/up.sh "$STATE_DIR"
# shellcheck disable=SC1091
. "$STATE_DIR/env.sh"
export DATABASE_URL KAFKA_BROKERS KAFKA_LIBS PG_BIN_DIR PYTHON

cargo build --workspace --bins
# The relay of the last release without buckets, for the upgrade test (built from this
# repository's history; cached under target/old-relay).
OUTBOX_RELAY_OLD_BIN="$(bash deploy/local/build-old-relay.sh)"
export OUTBOX_RELAY_OLD_BIN
# --no-fail-fast: one failing test binary must not hide the results of the others. The last
# line sums every binary's "test result" line, so a run reads at a glance.
log="$STATE_DIR/cargo-test.log"
set +e
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-3}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
awk '
    /^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/) passed += $i
            if ($(i+1) ~ /^failed/) failed += $i
            if ($(i+1) ~ /^ignored/) ignored += $i
        }
        binaries++
    }
    /^test .* \.\.\. FAILED$/ { names = names "\n  " $2 }
    END {
        printf "[run-tests.sh] SUMMARY: %d passed, %d failed, %d ignored in %d test binaries%s\n",
            passed, failed, ignored, binaries, (failed ? "; failed:" names : "")
    }' "$log"
exit "$status"
