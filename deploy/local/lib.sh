# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
#
# deploy/local/lib.sh: helpers shared by the local dev-environment scripts
# (install-deps.sh, up.sh, down.sh). Source it, don't run it:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Settings (environment, all optional):
#   OUTBOX_CACHE  cache for tools built/installed once  (default ~/.cache/outbox-relay)
#   KAFKA_LIBS    Apache Kafka's jars                    (default $CACHE/kafka-$KAFKA_VERSION/libs)
#   CONNECT_LIBS  Kafka Connect's jars                   (default $CACHE/kafka-connect-$CONNECT_VERSION/libs)
#   DEBEZIUM_PLUGIN_PATH  Kafka Connect plugin.path holding Debezium's PostgreSQL connector
#                 (default $CACHE/debezium-$DEBEZIUM_VERSION/plugins)
#   PG_BIN_DIR    PostgreSQL server binaries             (default newest /usr/lib/postgresql/*/bin)
#   PYTHON        python with kafka-python               (default $CACHE/venv/bin/python)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"

# Apache Kafka, from Maven Central (deploy/local/kafka/pom.xml pins the same version; the
# compose file's image too): the broker of up.sh, the tests, the benchmark and the chaos run.
KAFKA_VERSION=4.1.1
KAFKA_POM="$REPO_ROOT/deploy/local/kafka/pom.xml"
KAFKA_LOG4J="$REPO_ROOT/deploy/local/kafka/log4j2.yaml"
KAFKA_LIBS="${KAFKA_LIBS:-$CACHE/kafka-$KAFKA_VERSION/libs}"
KAFKA_BROKER_SH="$REPO_ROOT/deploy/local/kafka-broker.sh"

# Debezium's PostgreSQL connector and Outbox Event Router, run by a Kafka Connect standalone
# worker of the broker's release (deploy/local/debezium-connect.sh), both from Maven Central
# (deploy/local/debezium/connect-pom.xml and pom.xml pin the same versions): the test
# harness's Debezium (tests/src/debezium.rs), on the same PostgreSQL and broker.
CONNECT_VERSION=4.1.1
CONNECT_POM="$REPO_ROOT/deploy/local/debezium/connect-pom.xml"
CONNECT_LOG4J="$REPO_ROOT/deploy/local/debezium/log4j2.properties"
CONNECT_LIBS="${CONNECT_LIBS:-$CACHE/kafka-connect-$CONNECT_VERSION/libs}"
DEBEZIUM_VERSION=3.6.1.Final
DEBEZIUM_POM="$REPO_ROOT/deploy/local/debezium/pom.xml"
DEBEZIUM_PLUGIN_PATH="${DEBEZIUM_PLUGIN_PATH:-$CACHE/debezium-$DEBEZIUM_VERSION/plugins}"
DEBEZIUM_CONNECT_SH="$REPO_ROOT/deploy/local/debezium-connect.sh"

# mdBook builds the book in docs/ (deploy/local/book.sh), from crates.io into the cache.
MDBOOK_VERSION=0.5.4
MDBOOK="${MDBOOK:-$CACHE/mdbook-$MDBOOK_VERSION/bin/mdbook}"

# kafka-python is pure Python (no librdkafka), so tests/tools/kafka_tool.py is an
# independent check of what the Rust relay (rdkafka) put on the broker.
KAFKA_PYTHON_VERSION=3.0.12
LZ4_VERSION=4.4.5
# The CloudEvents SDK: reads the relay's CloudEvents back in the tests (an independent
# implementation of the Kafka protocol binding).
CLOUDEVENTS_VERSION=1.12.1
# Validators of the deployment files (tests/it/operations/deploy.rs), in the same venv: the compose file
# against the compose-spec schema, the Kubernetes manifests against the API schemas.
CHECK_JSONSCHEMA_VERSION=0.39.0
KUBERNETES_VALIDATE_VERSION=1.37.0
# The independent API fuzzer run against every service's /openapi.json (tests/it/security/openapi_fuzz.rs).
SCHEMATHESIS_VERSION=4.32.5
VENV="$CACHE/venv"
PYTHON="${PYTHON:-$VENV/bin/python}"
KAFKA_TOOL="$REPO_ROOT/tests/tools/kafka_tool.py"

# Newest installed PostgreSQL major version, e.g. /usr/lib/postgresql/15/bin.
newest_pg_bin_dir() {
    local d best=""
    for d in /usr/lib/postgresql/*/bin; do
        [[ -x "$d/initdb" ]] || continue
        if [[ -z "$best" ]] || [[ "$(printf '%s\n%s\n' "$best" "$d" | sort -V | tail -n 1)" == "$d" ]]; then
            best="$d"
        fi
    done
    printf '%s\n' "$best"
}
PG_BIN_DIR="${PG_BIN_DIR:-$(newest_pg_bin_dir)}"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Print the last lines of a log file to stderr (for failure reports).
log_tail() {
    local file="$1" lines="${2:-40}"
    if [[ -f "$file" ]]; then
        printf -- '----- last %s lines of %s -----\n' "$lines" "$file" >&2
        tail -n "$lines" "$file" >&2 || true
        printf -- '-----\n' >&2
    fi
}

# A TCP port on 127.0.0.1 that is free right now (the kernel picks it).
free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

# True when something accepts TCP connections on HOST:PORT.
port_open() {
    local host="$1" port="$2"
    (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# wait_for_port HOST PORT TIMEOUT_SECS [PID]
# Waits until HOST:PORT accepts connections. Fails after TIMEOUT_SECS, or as soon
# as PID (when given) has exited.
wait_for_port() {
    local host="$1" port="$2" timeout="$3" pid="${4:-}"
    local deadline=$((SECONDS + timeout))
    until port_open "$host" "$port"; do
        if [[ -n "$pid" ]] && ! pid_alive "$pid"; then
            log "process $pid exited before $host:$port accepted connections"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            log "timed out after ${timeout}s waiting for $host:$port"
            return 1
        fi
        sleep 0.1
    done
}

# Run a command as the postgres OS user when we are root (initdb and pg_ctl
# refuse to run as root), as ourselves otherwise.
as_pg_user() {
    if [[ "$(id -u)" == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# True when PID runs (a zombie waiting for its parent to reap it counts as gone).
pid_alive() {
    local pid="$1" state
    kill -0 "$pid" 2>/dev/null || return 1
    state="$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$pid/stat" 2>/dev/null || true)"
    [[ "$state" != Z ]]
}

# True when PID is alive and its command line mentions WORD.
pid_is() {
    local pid="$1" word="$2"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$word"
}

# Absolute state directory: the argument (relative to the current directory),
# or target/local-env under the repo root when none is given.
abs_state_dir() {
    if [[ -n "${1:-}" ]]; then
        realpath -m -- "$1"
    else
        printf '%s\n' "$REPO_ROOT/target/local-env"
    fi
}

# Marker file telling down.sh that a directory was made by up.sh (and may be removed).
STATE_MARKER=.outbox-local-env
