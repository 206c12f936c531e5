#!/usr/bin/env bash
#
# deploy/local/debezium-connect.sh: Debezium's PostgreSQL connector with its Outbox Event Router,
# run by a Kafka Connect standalone worker (org.apache.kafka.connect.cli.ConnectStandalone), from
# the jars install-deps.sh put in the cache (Kafka Connect $CONNECT_VERSION, Debezium
# $DEBEZIUM_VERSION on the worker's plugin.path). The test harness's Debezium
# (tests/src/debezium.rs): what teams coming from Debezium have on their topics, on the same
# PostgreSQL and broker as the relay. Runs in the foreground: the script execs the JVM, so the
# caller's child pid IS the worker's (SIGTERM, SIGKILL, SIGSTOP reach it).
#
#   debezium-connect.sh --dir DIR --brokers HOST:PORT --table SCHEMA.TABLE
#                       --slot NAME --publication NAME [--rest-port PORT] [--name NAME]
#                       [--topic-prefix PREFIX] [--topic-partitions N] [--snapshot-mode MODE]
#                       [--converter C] [--key-converter C] [--value-converter C]
#                       [--router KEY=VALUE]... [--connector-config FILE]
#                       [--pg-host H] [--pg-port P] [--pg-user U] [--pg-dbname D]
#                       [--pg-password-file F] [--pg-sslmode M]
#
#   --dir DIR           state: worker.properties and connector.properties (written here each
#                       start), offsets (kept across restarts), rest.port, secrets/
#   --brokers B         the worker's bootstrap.servers
#   --table S.T         the outbox table (Debezium's shape: id, aggregatetype, aggregateid, type,
#                       payload), its table.include.list
#   --slot NAME         the replication slot Debezium creates and streams from (slot.name); the
#                       caller drops it after the worker stopped (Debezium leaves it)
#   --publication NAME  the publication the caller created FOR TABLE S.T (publication.name;
#                       publication.autocreate.mode=disabled: the connector's role needs no
#                       ownership of the table)
#   --rest-port PORT    the REST API on 127.0.0.1 (default: a free port); written to DIR/rest.port
#   --name NAME         the connector's name in the REST API (default outbox-connector)
#   --topic-prefix P    Debezium's topic.prefix (its logical name; default dbz). The routed
#                       topics come from the router (route.topic.replacement)
#   --topic-partitions N  partitions of the topics the worker creates (default 1; replication 1):
#                       the broker creates none by itself (auto.create.topics.enable=false)
#   --snapshot-mode M   snapshot.mode (default no_data: stream what is committed after the slot
#                       exists, no snapshot of the rows already there)
#   --converter C       key and value converter: string (StringConverter, default), json
#                       (JsonConverter, schemas.enable=true), json-schemaless (JsonConverter,
#                       schemas.enable=false); --key-converter / --value-converter set one
#   --router K=V        transforms.outbox.K=V, e.g. route.topic.replacement=outbox.event.\${routedByValue},
#                       table.field.event.key=aggregateid, table.fields.additional.placement=type:header:eventType,
#                       route.tombstone.on.empty.payload=true (repeatable)
#   --connector-config F  properties appended to the connector's (they override the above)
#
# PostgreSQL (arguments, else the environment): --pg-host (PGHOST, default 127.0.0.1),
# --pg-port (PGPORT, default 5432), --pg-user (PGUSER, default debezium), --pg-dbname
# (PGDATABASE, required), --pg-sslmode (PGSSLMODE: database.sslmode, only when given),
# --pg-password-file (DATABASE_PASSWORD_FILE: the password, less one trailing newline; none: no
# password). The password is never on a command line nor in a properties file: it is copied to
# DIR/secrets/password (mode 600) and the connector reads it through Kafka's
# DirectoryConfigProvider (database.password=${dir:DIR/secrets:password}); the REST API and the
# log show the reference, not the value.
#
# A small heap (CONNECT_HEAP_OPTS, default -Xms128m -Xmx512m). Ready is for the caller to judge:
# GET /connectors/NAME/status on the REST port says RUNNING for the connector and its task,
# and the slot is active in pg_replication_slots; never a sleep.
set -euo pipefail

# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir="" brokers="" table="" slot="" publication="" rest_port="" name=outbox-connector
topic_prefix=dbz topic_partitions=1 snapshot_mode=no_data connector_config=""
key_converter=string value_converter=string
pg_host="${PGHOST:-127.0.0.1}" pg_port="${PGPORT:-5432}" pg_user="${PGUSER:-debezium}"
pg_dbname="${PGDATABASE:-}" pg_sslmode="${PGSSLMODE:-}" pg_password_file="${DATABASE_PASSWORD_FILE:-}"
router=()
while (($#)); do
    case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --brokers) brokers="$2"; shift 2 ;;
    --table) table="$2"; shift 2 ;;
    --slot) slot="$2"; shift 2 ;;
    --publication) publication="$2"; shift 2 ;;
    --rest-port) rest_port="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --topic-prefix) topic_prefix="$2"; shift 2 ;;
    --topic-partitions) topic_partitions="$2"; shift 2 ;;
    --snapshot-mode) snapshot_mode="$2"; shift 2 ;;
    --converter) key_converter="$2" value_converter="$2"; shift 2 ;;
    --key-converter) key_converter="$2"; shift 2 ;;
    --value-converter) value_converter="$2"; shift 2 ;;
    --router) router+=("$2"); shift 2 ;;
    --connector-config) connector_config="$2"; shift 2 ;;
    --pg-host) pg_host="$2"; shift 2 ;;
    --pg-port) pg_port="$2"; shift 2 ;;
    --pg-user) pg_user="$2"; shift 2 ;;
    --pg-dbname) pg_dbname="$2"; shift 2 ;;
    --pg-sslmode) pg_sslmode="$2"; shift 2 ;;
    --pg-password-file) pg_password_file="$2"; shift 2 ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
done
[[ -n "$dir" && -n "$brokers" && -n "$table" && -n "$slot" && -n "$publication" ]] ||
    die "usage: $0 --dir DIR --brokers HOST:PORT --table SCHEMA.TABLE --slot NAME --publication NAME [...]"
[[ -n "$pg_dbname" ]] || die "no database: give --pg-dbname (or PGDATABASE)"
[[ "$table" == *.* ]] || die "--table $table: give it as SCHEMA.TABLE"
[[ -f "$CONNECT_LIBS/.complete" ]] || die "no Kafka Connect jars in $CONNECT_LIBS: run deploy/local/install-deps.sh"
[[ -f "$DEBEZIUM_PLUGIN_PATH/debezium-connector-postgres/.complete" ]] ||
    die "no Debezium connector in $DEBEZIUM_PLUGIN_PATH: run deploy/local/install-deps.sh"
command -v java >/dev/null || die "java not found: Kafka Connect $CONNECT_VERSION needs Java 17"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
[[ -n "$rest_port" ]] || rest_port="$(free_port)"
printf '%s\n' "$rest_port" >"$dir/rest.port"

# converter_properties PREFIX KIND: PREFIX.converter and its schemas.enable.
converter_properties() {
    local prefix="$1" kind="$2"
    case "$kind" in
    string) printf '%s.converter=org.apache.kafka.connect.storage.StringConverter\n' "$prefix" ;;
    json | json-schemaless)
        printf '%s.converter=org.apache.kafka.connect.json.JsonConverter\n' "$prefix"
        printf '%s.converter.schemas.enable=%s\n' "$prefix" "$([[ "$kind" == json ]] && echo true || echo false)"
        ;;
    *) die "converter '$kind': string, json or json-schemaless" ;;
    esac
}

# The password, copied for DirectoryConfigProvider (which reads a file's whole content): the file
# less one trailing newline, written by bash's builtins only (no command line carries it).
# The directory exists either way: the provider refuses an allowed path that does not.
secrets="$dir/secrets"
(umask 077 && mkdir -p "$secrets")
rm -f "$secrets/password"
password_ref=""
if [[ -n "$pg_password_file" ]]; then
    [[ -r "$pg_password_file" ]] || die "cannot read the password file $pg_password_file"
    pw=""
    IFS= read -r -d '' pw <"$pg_password_file" || true
    pw="${pw%$'\n'}"
    pw="${pw%$'\r'}"
    [[ -n "$pw" ]] || die "the password file $pg_password_file is empty"
    (umask 077 && printf '%s' "$pw" >"$secrets/password")
    unset pw
    password_ref="\${dir:$secrets:password}"
fi

{
    printf '# written by deploy/local/debezium-connect.sh at every start; edits are lost\n'
    printf 'bootstrap.servers=%s\n' "$brokers"
    printf 'offset.storage.file.filename=%s\n' "$dir/offsets"
    printf 'listeners=http://127.0.0.1:%s\n' "$rest_port"
    printf 'rest.advertised.host.name=127.0.0.1\nrest.advertised.port=%s\n' "$rest_port"
    printf 'plugin.path=%s\n' "$DEBEZIUM_PLUGIN_PATH"
    converter_properties key "$key_converter"
    converter_properties value "$value_converter"
    printf 'config.providers=dir\n'
    printf 'config.providers.dir.class=org.apache.kafka.common.config.provider.DirectoryConfigProvider\n'
    printf 'config.providers.dir.param.allowed.paths=%s\n' "$secrets"
    cat <<'EOF'
# Offsets (the LSN Debezium confirms to the slot) flushed each second: a restart resumes close to
# where it stopped, and the slot's confirmed_flush_lsn follows the published events.
offset.flush.interval.ms=1000
# The worker creates the routed topics (the broker does not), as each connector asks.
topic.creation.enable=true
# Only the classes the plugins declare (service loader manifests): a quick start.
plugin.discovery=service_load
EOF
} >"$dir/worker.properties.tmp"
mv "$dir/worker.properties.tmp" "$dir/worker.properties"

{
    printf '# written by deploy/local/debezium-connect.sh at every start; edits are lost\n'
    printf 'name=%s\n' "$name"
    printf 'connector.class=io.debezium.connector.postgresql.PostgresConnector\n'
    printf 'tasks.max=1\nplugin.name=pgoutput\n'
    printf 'database.hostname=%s\ndatabase.port=%s\ndatabase.user=%s\ndatabase.dbname=%s\n' \
        "$pg_host" "$pg_port" "$pg_user" "$pg_dbname"
    [[ -z "$password_ref" ]] || printf 'database.password=%s\n' "$password_ref"
    [[ -z "$pg_sslmode" ]] || printf 'database.sslmode=%s\n' "$pg_sslmode"
    printf 'topic.prefix=%s\n' "$topic_prefix"
    printf 'table.include.list=%s\n' "$table"
    printf 'slot.name=%s\npublication.name=%s\npublication.autocreate.mode=disabled\n' "$slot" "$publication"
    printf 'snapshot.mode=%s\n' "$snapshot_mode"
    # An outbox row is deleted once published (or never): no tombstone for a delete.
    printf 'tombstones.on.delete=false\n'
    printf 'topic.creation.default.replication.factor=1\ntopic.creation.default.partitions=%s\n' "$topic_partitions"
    printf 'transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n'
    for kv in "${router[@]}"; do
        [[ "$kv" =~ ^[A-Za-z0-9._-]+= ]] || die "--router $kv: give it as KEY=VALUE"
        printf 'transforms.outbox.%s\n' "$kv"
    done
    if [[ -n "$connector_config" ]]; then
        printf '# from %s\n' "$connector_config"
        cat "$connector_config"
    fi
} >"$dir/connector.properties.tmp"
mv "$dir/connector.properties.tmp" "$dir/connector.properties"

# shellcheck disable=SC2086  # the heap options are words
exec java ${CONNECT_HEAP_OPTS:--Xms128m -Xmx512m} \
    -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$CONNECT_LOG4J" \
    -cp "$CONNECT_LIBS/*" org.apache.kafka.connect.cli.ConnectStandalone \
    "$dir/worker.properties" "$dir/connector.properties"
