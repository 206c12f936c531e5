#!/usr/bin/env bash
#
# deploy/local/up.sh [STATE_DIR]: start a throwaway local environment for the
# outbox relay: a PostgreSQL cluster and a tansu (Kafka-compatible) broker, each
# on a free port of 127.0.0.1, with state and logs in STATE_DIR (default
# target/local-env under the repo root). deploy/local/down.sh stops it again.
#
#   - PostgreSQL (initdb + pg_ctl, trust auth, database `outbox`) is skipped
#     when DATABASE_URL is already set;
#   - tansu (memory storage; TANSU_STORAGE=sqlite keeps it in STATE_DIR/tansu.db, with the
#     header index tansu 0.6.0 lacks: deploy/local/tansu-sqlite-index.py)
#     is skipped when KAFKA_BROKERS is already set;
#   - topics TOPICS (space separated, default `outbox.event.order`; empty: none) are created
#     with TOPIC_PARTITIONS partitions (default 6) on whichever broker is used
#     (tansu does not create topics on its own);
#   - STATE_DIR/env.sh gets `export DATABASE_URL=... KAFKA_BROKERS=...
#     TANSU_BIN=... PG_BIN_DIR=... PYTHON=...`: `. target/local-env/env.sh`.
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
TANSU_STORAGE="${TANSU_STORAGE:-memory}"
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
        if ! as_pg_user "$PG_BIN_DIR/pg_ctl" -D "$datadir/data" -l "$pglog" -w -t "$UP_TIMEOUT" \
            -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$sockdir" \
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

# --- tansu --------------------------------------------------------------------
start_tansu() {
    [[ -x "$TANSU_BIN" ]] || die "no tansu at $TANSU_BIN: run deploy/local/install-deps.sh"
    local pid port storage tlog="$STATE_DIR/tansu.log"
    pid="$(cat "$STATE_DIR/tansu.pid" 2>/dev/null || true)"
    if pid_is "$pid" tansu; then
        port="$(cat "$STATE_DIR/tansu.port")"
        log "tansu: already running (pid $pid) on 127.0.0.1:$port, reusing it"
    else
        case "$TANSU_STORAGE" in
        memory) storage="memory://tansu/" ;;
        # tansu 0.6.0 resolves a sqlite URL against its working directory
        # (cwd + host + path, even for sqlite:///abs/path), and it runs in
        # STATE_DIR: this is STATE_DIR/tansu.db.
        sqlite) storage="sqlite://tansu.db" ;;
        *) die "TANSU_STORAGE must be memory or sqlite, not '$TANSU_STORAGE'" ;;
        esac
        # Keep the port across restarts (clients of a restarted sqlite broker
        # find it again), unless something else took it meanwhile.
        port="$(cat "$STATE_DIR/tansu.port" 2>/dev/null || true)"
        if [[ -z "$port" ]] || port_open 127.0.0.1 "$port"; then
            port="$(free_port)"
        fi
        printf '%s\n' "$port" >"$STATE_DIR/tansu.port"
        log "tansu: starting on 127.0.0.1:$port, storage $storage (log $tlog)"
        # setsid: its own session, so it outlives this script and the terminal
        # (or make) that started it. In a non-interactive script the background
        # child is no process-group leader, so setsid execs in place and $! is
        # tansu's own pid.
        (
            cd "$STATE_DIR"
            exec setsid "$TANSU_BIN" broker \
                --listener-url "tcp://127.0.0.1:$port" \
                --advertised-listener-url "tcp://127.0.0.1:$port" \
                --storage-engine "$storage" \
                --cluster-id outbox-local
        ) </dev/null >>"$tlog" 2>&1 &
        pid=$!
        printf '%s\n' "$pid" >"$STATE_DIR/tansu.pid"
    fi
    if ! wait_for_port 127.0.0.1 "$port" "$UP_TIMEOUT" "$pid"; then
        log_tail "$tlog"
        die "tansu does not accept connections on 127.0.0.1:$port"
    fi
    if [[ "$TANSU_STORAGE" == sqlite ]]; then
        # The index tansu 0.6.0's sqlite storage lacks (see the script).
        "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/tansu-sqlite-index.py" "$STATE_DIR/tansu.db"
    fi
    KAFKA_BROKERS="127.0.0.1:$port"
}

# DATABASE_URL / KAFKA_BROKERS pointing at this STATE_DIR's own servers (e.g.
# after `. env.sh`) count as unset: those servers are checked and reused.
own_pg_url="postgres://postgres@127.0.0.1:$(cat "$STATE_DIR/pg.port" 2>/dev/null || echo none)/outbox"
own_brokers="127.0.0.1:$(cat "$STATE_DIR/tansu.port" 2>/dev/null || echo none)"

if [[ -n "${DATABASE_URL:-}" && "$DATABASE_URL" != "$own_pg_url" ]]; then
    log "postgres: DATABASE_URL is set, not starting one"
else
    start_postgres
fi

if [[ -n "${KAFKA_BROKERS:-}" && "$KAFKA_BROKERS" != "$own_brokers" ]]; then
    log "tansu: KAFKA_BROKERS is set, not starting a broker"
else
    start_tansu
fi

# --- topics -------------------------------------------------------------------
read -r -a topic_list <<<"$TOPICS"
if ((${#topic_list[@]} > 0)); then
    if ! "$PYTHON" "$KAFKA_TOOL" create-topics --brokers "$KAFKA_BROKERS" \
        --partitions "$TOPIC_PARTITIONS" --timeout "$UP_TIMEOUT" "${topic_list[@]}" \
        >"$STATE_DIR/topics.json" 2>"$STATE_DIR/topics.log"; then
        cat "$STATE_DIR/topics.log" >&2
        [[ -f "$STATE_DIR/tansu.log" ]] && log_tail "$STATE_DIR/tansu.log"
        die "creating topics ${topic_list[*]} on $KAFKA_BROKERS failed"
    fi
    log "topics: $(tr '\n' ' ' <"$STATE_DIR/topics.json")"
fi

# --- env.sh -------------------------------------------------------------------
{
    printf '# written by deploy/local/up.sh; source it: . %q\n' "$STATE_DIR/env.sh"
    printf 'export DATABASE_URL=%q KAFKA_BROKERS=%q TANSU_BIN=%q PG_BIN_DIR=%q PYTHON=%q\n' \
        "$DATABASE_URL" "$KAFKA_BROKERS" "$TANSU_BIN" "$PG_BIN_DIR" "$PYTHON"
} >"$STATE_DIR/env.sh.tmp"
mv "$STATE_DIR/env.sh.tmp" "$STATE_DIR/env.sh"

printf 'DATABASE_URL=%s\n' "$DATABASE_URL"
printf 'KAFKA_BROKERS=%s\n' "$KAFKA_BROKERS"
log "environment: . $STATE_DIR/env.sh"
