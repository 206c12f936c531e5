#!/usr/bin/env bash
#
# deploy/local/down.sh [STATE_DIR]: stop what deploy/local/up.sh started in
# STATE_DIR (default target/local-env under the repo root) and remove it.
#
# Only processes recorded there are touched: the PostgreSQL cluster whose data
# directory STATE_DIR/pg.datadir names (pg_ctl stop -m fast) and the Kafka
# broker in STATE_DIR/kafka.pid (SIGTERM, SIGKILL after DOWN_TIMEOUT seconds,
# default 10). Servers that up.sh did not start (DATABASE_URL / KAFKA_BROKERS
# given from outside) are left alone. A directory without up.sh's marker file
# is never removed.
set -euo pipefail

# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE_DIR="$(abs_state_dir "${1:-}")"
DOWN_TIMEOUT="${DOWN_TIMEOUT:-10}"

if [[ ! -d "$STATE_DIR" ]]; then
    log "$STATE_DIR does not exist: nothing to stop"
    exit 0
fi
[[ -f "$STATE_DIR/$STATE_MARKER" ]] ||
    die "$STATE_DIR was not made by up.sh (no $STATE_MARKER): not touching it"

failed=0

# --- kafka: SIGTERM now (a controlled shutdown takes a few s), wait after PostgreSQL ----------
kafka_pid=""
if [[ -f "$STATE_DIR/kafka.pid" ]]; then
    pid="$(cat "$STATE_DIR/kafka.pid")"
    if pid_is "$pid" kafka; then
        log "kafka: stopping pid $pid"
        kill -TERM "$pid" 2>/dev/null || true
        kafka_pid="$pid"
    else
        log "kafka: pid $pid is not running"
    fi
fi
kafka_deadline=$((SECONDS + DOWN_TIMEOUT))

# --- PostgreSQL ---------------------------------------------------------------
if [[ -f "$STATE_DIR/pg.datadir" ]]; then
    datadir="$(cat "$STATE_DIR/pg.datadir")"
    pg_ctl="$PG_BIN_DIR/pg_ctl"
    if [[ -f "$datadir/data/postmaster.pid" ]] &&
        as_pg_user "$pg_ctl" -D "$datadir/data" status >/dev/null 2>&1; then
        log "postgres: stopping ($datadir/data)"
        if ! as_pg_user "$pg_ctl" -D "$datadir/data" stop -m fast -w -t "$DOWN_TIMEOUT" >/dev/null; then
            pid="$(head -n 1 "$datadir/data/postmaster.pid" 2>/dev/null || true)"
            if pid_is "$pid" postgres; then
                log "postgres: fast shutdown timed out, stopping immediately"
                as_pg_user "$pg_ctl" -D "$datadir/data" stop -m immediate -w -t "$DOWN_TIMEOUT" >/dev/null ||
                    failed=1
            fi
        fi
    else
        log "postgres: not running"
    fi
    # Data kept outside STATE_DIR (see up.sh) is removed too.
    if ((failed == 0)) && [[ "$datadir" == /tmp/outbox-local-pg.* ]]; then
        rm -rf -- "$datadir"
    fi
fi

if [[ -n "$kafka_pid" ]]; then
    while pid_alive "$kafka_pid" && ((SECONDS < kafka_deadline)); do sleep 0.1; done
    if pid_alive "$kafka_pid"; then
        log "kafka: still running after ${DOWN_TIMEOUT}s, sending SIGKILL"
        kill -KILL "$kafka_pid" 2>/dev/null || true
        sleep 0.2
        if pid_alive "$kafka_pid"; then
            log "kafka: pid $kafka_pid survived SIGKILL"
            failed=1
        fi
    fi
fi

((failed == 0)) || die "could not stop everything; $STATE_DIR left in place"
rm -rf -- "$STATE_DIR"
log "stopped and removed $STATE_DIR"
