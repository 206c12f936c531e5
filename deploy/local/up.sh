#!/usr/bin/env bash
#
# deploy/local/up.sh [STATE_DIR]: start a throwaway local environment for the
# outbox relay: a PostgreSQL cluster and an Apache Kafka broker (single-node KRaft,
# deploy/local/kafka-broker.sh), each on a free port of 127.0.0.1, with state and logs in
# STATE_DIR (default
# target/local-env under the repo root). deploy/local/down.sh stops it again.
#
#   - PostgreSQL (initdb + pg_ctl, trust auth, database `outbox`, wal_level=logical for the
#     harness's Debezium) is skipped when DATABASE_URL is already set;
#   - Kafka (storage in STATE_DIR/kafka, kept across restarts; ready once a metadata request
#     answers) is skipped when KAFKA_BROKERS is already set;
#   - topics TOPICS (space separated, default `outbox.event.order`; empty: none) are created
#     with TOPIC_PARTITIONS partitions (default 6) on whichever broker is used
#     (the broker does not create topics on its own: auto.create.topics.enable=false);
#   - STATE_DIR/env.sh gets `export DATABASE_URL=... KAFKA_BROKERS=...
#     KAFKA_LIBS=... PG_BIN_DIR=... PYTHON=...`: `. target/local-env/env.sh`.
#
# Running it again while the environment is up reuses the running servers.
# Needs deploy/local/install-deps.sh to have run. UP_TIMEOUT (default 60)
# bounds each wait, in seconds.
set -euo pipefail

# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE_DIR="$(abs_state_dir "${1:-}")"
TOPICS="${TOPICS-outbox.event.order}"
TOPIC_PARTITIONS="${TOPIC_PARTITIONS:-6}"
UP_TIMEOUT="${UP_TIMEOUT:-60}"

[[ -x "$PYTHON" ]] || die "no python at $PYTHON: run deploy/local/install-deps.sh"

if [[ -d "$STATE_DIR" && ! -f "$STATE_DIR/$STATE_MARKER" ]] && [[ -n "$(ls -A "$STATE_DIR")" ]]; then
    die "$STATE_DIR exists, is not empty and was not made by up.sh: refusing to use it"
fi
mkdir -p "$STATE_DIR"
touch "$STATE_DIR/$STATE_MARKER"

# --- PostgreSQL ---------------------------------------------------------------
start_postgres() {
    [[ -x "$PG_BIN_DIR/initdb" ]] || die "no initdb in '$PG_BIN_DIR': run deploy/local/install-deps.sh"

    # The data directory must belong to the postgres user when we are root, and
    # that user must be able to reach it: STATE_DIR may sit below a directory
    # only root can enter (e.g. /root), then the data goes to /tmp instead.
    # STATE_DIR/pg.datadir records where it is; down.sh removes it.
    local datadir
    if [[ -f "$STATE_DIR/pg.datadir" ]]; then
        datadir="$(cat "$STATE_DIR/pg.datadir")"
    elif as_pg_user test -x "$STATE_DIR" 2>/dev/null; then
        datadir="$STATE_DIR/pg"
    else
        datadir="$(mktemp -d /tmp/outbox-local-pg.XXXXXX)"
    fi
    local pglog="$datadir/postgres.log" sockdir="$datadir/sock"

    if [[ ! -f "$datadir/data/PG_VERSION" ]]; then
        mkdir -p "$datadir"
        printf '%s\n' "$datadir" >"$STATE_DIR/pg.datadir"
        [[ "$(id -u)" == 0 ]] && chown postgres: "$datadir"
        log "postgres: initdb in $datadir/data"
        if ! as_pg_user "$PG_BIN_DIR/initdb" -D "$datadir/data" -U postgres --auth=trust \
            --encoding=UTF8 --locale=C.UTF-8 --no-sync >"$STATE_DIR/initdb.log" 2>&1; then
            log_tail "$STATE_DIR/initdb.log"
            die "initdb failed"
        fi
        as_pg_user mkdir -p "$sockdir"
    fi
    ln -sfn "$pglog" "$STATE_DIR/postgres.log"

    local port
    if as_pg_user "$PG_BIN_DIR/pg_ctl" -D "$datadir/data" status >/dev/null 2>&1; then
        port="$(cat "$STATE_DIR/pg.port")"
        log "postgres: already running on 127.0.0.1:$port, reusing it"
    else
        port="$(cat "$STATE_DIR/pg.port" 2>/dev/null || true)"
        if [[ -z "$port" ]] || port_open 127.0.0.1 "$port"; then
            port="$(free_port)"
        fi
        printf '%s\n' "$port" >"$STATE_DIR/pg.port"
        log "postgres: starting on 127.0.0.1:$port (log $STATE_DIR/postgres.log)"
        # Only TCP on 127.0.0.1, plus a unix socket in the data dir (the
        # default /var/run/postgresql may not exist or belong to another cluster).
        # wal_level=logical: the harness's Debezium (tests/src/debezium.rs) streams from a
        # logical replication slot (the defaults give 10 slots and WAL senders); it costs a
        # little more WAL per write. max_connections=300: the test suite runs three tests at
        # once, and one whole system (three relays, the order service, two consumers, the
        # test's own pool) holds up to about fifty; three of them went past the default 100.
        if ! as_pg_user "$PG_BIN_DIR/pg_ctl" -D "$datadir/data" -l "$pglog" -w -t "$UP_TIMEOUT" \
            -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$sockdir -c wal_level=logical -c max_connections=300" \
            start >"$STATE_DIR/pg_ctl.log" 2>&1; then
            cat "$STATE_DIR/pg_ctl.log" >&2
            log_tail "$pglog"
            die "postgres did not start"
        fi
    fi
    if ! wait_for_port 127.0.0.1 "$port" "$UP_TIMEOUT"; then
        log_tail "$pglog"
        die "postgres does not accept connections on 127.0.0.1:$port"
    fi

    local psql=("$PG_BIN_DIR/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres)
    if [[ "$("${psql[@]}" -d postgres -tAc "select 1 from pg_database where datname = 'outbox'")" != 1 ]]; then
        "${psql[@]}" -d postgres -c 'create database outbox' >/dev/null
        log "postgres: created database outbox"
    fi
    DATABASE_URL="postgres://postgres@127.0.0.1:$port/outbox"
}

# --- Kafka --------------------------------------------------------------------
start_kafka() {
    local pid port klog="$STATE_DIR/kafka.log" started=$SECONDS
    pid="$(cat "$STATE_DIR/kafka.pid" 2>/dev/null || true)"
    if pid_is "$pid" kafka; then
        port="$(cat "$STATE_DIR/kafka.port")"
        log "kafka: already running (pid $pid) on 127.0.0.1:$port, reusing it"
    else
        # Keep the port across restarts (clients of a restarted broker find it again), unless
        # something else took it meanwhile.
        port="$(cat "$STATE_DIR/kafka.port" 2>/dev/null || true)"
        if [[ -z "$port" ]] || port_open 127.0.0.1 "$port"; then
            port="$(free_port)"
        fi
        printf '%s\n' "$port" >"$STATE_DIR/kafka.port"
        log "kafka: starting Apache Kafka $KAFKA_VERSION on 127.0.0.1:$port (log $klog)"
        # setsid: its own session, so it outlives this script and the terminal (or make) that
        # started it. In a non-interactive script the background child is no process-group
        # leader, so setsid execs in place, and kafka-broker.sh execs the JVM: $! is the
        # broker's own pid.
        setsid bash "$KAFKA_BROKER_SH" --dir "$STATE_DIR/kafka" --port "$port" \
            </dev/null >>"$klog" 2>&1 &
        pid=$!
        printf '%s\n' "$pid" >"$STATE_DIR/kafka.pid"
    fi
    if ! "$PYTHON" "$KAFKA_TOOL" ready --brokers "127.0.0.1:$port" --timeout "$UP_TIMEOUT" \
        --pid "$pid" >/dev/null 2>"$STATE_DIR/kafka-ready.log"; then
        cat "$STATE_DIR/kafka-ready.log" >&2
        log_tail "$klog"
        die "kafka does not answer metadata requests on 127.0.0.1:$port"
    fi
    log "kafka: ready after $((SECONDS - started)) s (pid $pid)"
    KAFKA_BROKERS="127.0.0.1:$port"
}

# DATABASE_URL / KAFKA_BROKERS pointing at this STATE_DIR's own servers (e.g.
# after `. env.sh`) count as unset: those servers are checked and reused.
own_pg_url="postgres://postgres@127.0.0.1:$(cat "$STATE_DIR/pg.port" 2>/dev/null || echo none)/outbox"
own_brokers="127.0.0.1:$(cat "$STATE_DIR/kafka.port" 2>/dev/null || echo none)"

if [[ -n "${DATABASE_URL:-}" && "$DATABASE_URL" != "$own_pg_url" ]]; then
    log "postgres: DATABASE_URL is set, not starting one"
else
    start_postgres
fi

if [[ -n "${KAFKA_BROKERS:-}" && "$KAFKA_BROKERS" != "$own_brokers" ]]; then
    log "kafka: KAFKA_BROKERS is set, not starting a broker"
else
    start_kafka
fi

# --- topics -------------------------------------------------------------------
read -r -a topic_list <<<"$TOPICS"
if ((${#topic_list[@]} > 0)); then
    if ! "$PYTHON" "$KAFKA_TOOL" create-topics --brokers "$KAFKA_BROKERS" \
        --partitions "$TOPIC_PARTITIONS" --timeout "$UP_TIMEOUT" "${topic_list[@]}" \
        >"$STATE_DIR/topics.json" 2>"$STATE_DIR/topics.log"; then
        cat "$STATE_DIR/topics.log" >&2
        [[ -f "$STATE_DIR/kafka.log" ]] && log_tail "$STATE_DIR/kafka.log"
        die "creating topics ${topic_list[*]} on $KAFKA_BROKERS failed"
    fi
    log "topics: $(tr '\n' ' ' <"$STATE_DIR/topics.json")"
fi

# --- env.sh -------------------------------------------------------------------
{
    printf '# written by deploy/local/up.sh; source it: . %q\n' "$STATE_DIR/env.sh"
    printf 'export DATABASE_URL=%q KAFKA_BROKERS=%q KAFKA_LIBS=%q PG_BIN_DIR=%q PYTHON=%q\n' \
        "$DATABASE_URL" "$KAFKA_BROKERS" "$KAFKA_LIBS" "$PG_BIN_DIR" "$PYTHON"
} >"$STATE_DIR/env.sh.tmp"
mv "$STATE_DIR/env.sh.tmp" "$STATE_DIR/env.sh"

printf 'DATABASE_URL=%s\n' "$DATABASE_URL"
printf 'KAFKA_BROKERS=%s\n' "$KAFKA_BROKERS"
log "environment: . $STATE_DIR/env.sh"
