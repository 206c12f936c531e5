#!/usr/bin/env bash
#
# deploy/local/kafka-broker.sh: the one way this repository starts Apache Kafka (up.sh, the
# test harness, make bench, make chaos). A single-node KRaft broker, broker and controller in
# one JVM, from the jars install-deps.sh put in the cache; its storage is formatted on the
# first start and kept across restarts. Runs in the foreground: the script execs the JVM, so
# the caller's child pid IS the broker's (SIGKILL, SIGSTOP, restart reach the real broker).
#
#   kafka-broker.sh --dir DIR --port PORT [--advertise HOST:PORT] [--host HOST]
#                   [--listener NAME://HOST:PORT[=AHOST:APORT]]... [--config-file FILE]
#                   [--join FIRST_DIR --node-id N]
#
#   --dir DIR         state: server.properties (written here each start), data/, controller.port
#   --port PORT       the PLAINTEXT listener on HOST (default 127.0.0.1), also the
#                     inter-broker listener
#   --advertise H:P   what the PLAINTEXT listener advertises (default HOST:PORT): a proxy's
#                     address when clients reach the broker through one
#   --listener L      another listener, advertised as given (e.g. SASL_SSL://localhost:9094);
#                     its security settings come from --config-file.
#                     NAME://HOST:PORT=AHOST:APORT listens on HOST:PORT and advertises
#                     NAME://AHOST:APORT (a name its certificate lacks, a port nothing
#                     listens on: the tests of what clients make of such a broker)
#   --config-file F   properties appended last (they override the defaults below)
#   --join DIR        a broker-only node (no controller) joining the cluster whose first node
#                     keeps its state in DIR (its controller port, its cluster id): a second
#                     broker, for the tests of a partition whose only broker is gone
#   --node-id N       this node's id (default 1; give a joining node another)
#   DIR/format.args   when present at the first start: extra arguments of the storage format,
#                     one per line (e.g. `--add-scram` and its value: SCRAM users exist from the
#                     first second, and their passwords never appear on a command line)
#
# Settings for a one-node cluster: internal topics at replication factor 1, no automatic topic
# creation (our code creates its topics; with it on, the relay's metadata check would create
# them with one partition), no initial rebalance delay, a small heap (KAFKA_HEAP_OPTS, default
# -Xms256m -Xmx512m). Ready is for the caller to judge with a metadata request
# (kafka_tool.py ready, or the harness's own), never a sleep.
set -euo pipefail

# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir="" port="" advertise="" host=127.0.0.1 config_file="" join="" node_id=1
listeners=()
while (($#)); do
    case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --advertise) advertise="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --listener) listeners+=("$2"); shift 2 ;;
    --config-file) config_file="$2"; shift 2 ;;
    --join) join="$2"; shift 2 ;;
    --node-id) node_id="$2"; shift 2 ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
done
[[ -n "$dir" && -n "$port" ]] || die "usage: $0 --dir DIR --port PORT [...]"
[[ -d "$KAFKA_LIBS" ]] || die "no Kafka jars in $KAFKA_LIBS: run deploy/local/install-deps.sh"
command -v java >/dev/null || die "java not found: Kafka $KAFKA_VERSION needs Java 17"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
advertise="${advertise:-$host:$port}"

cluster_id=""
if [[ -n "$join" ]]; then
    # A broker of the first node's cluster: its controller, its cluster id.
    [[ -s "$join/controller.port" && -f "$join/data/meta.properties" ]] \
        || die "--join $join: no started first node there (controller.port, data/meta.properties)"
    cport="$(cat "$join/controller.port")"
    cluster_id="$(sed -n 's/^cluster.id=//p' "$join/data/meta.properties")"
    roles=broker
    all_listeners="PLAINTEXT://$host:$port"
else
    # The controller's port is part of the quorum's identity: the same one on every restart.
    if [[ ! -s "$dir/controller.port" ]]; then
        free_port >"$dir/controller.port"
    fi
    cport="$(cat "$dir/controller.port")"
    roles=broker,controller
    all_listeners="PLAINTEXT://$host:$port,CONTROLLER://127.0.0.1:$cport"
fi
advertised="PLAINTEXT://$advertise"
for l in "${listeners[@]}"; do
    if [[ "$l" == *=* ]]; then
        all_listeners+=",${l%%=*}"
        advertised+=",${l%%://*}://${l#*=}"
    else
        all_listeners+=",$l"
        advertised+=",$l"
    fi
done

{
    printf '# written by deploy/local/kafka-broker.sh at every start; edits are lost\n'
    printf 'process.roles=%s\nnode.id=%s\n' "$roles" "$node_id"
    printf 'controller.quorum.voters=1@127.0.0.1:%s\n' "$cport"
    printf 'controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n'
    printf 'listeners=%s\nadvertised.listeners=%s\n' "$all_listeners" "$advertised"
    printf 'listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,SASL_PLAINTEXT:SASL_PLAINTEXT\n'
    printf 'log.dirs=%s\n' "$dir/data"
    cat <<'EOF'
# One node: every internal topic at replication factor 1.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
num.partitions=1
# Small, quick to start and to clean.
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
    if [[ -n "$config_file" ]]; then
        printf '# from %s\n' "$config_file"
        cat "$config_file"
    fi
} >"$dir/server.properties.tmp"
mv "$dir/server.properties.tmp" "$dir/server.properties"

if [[ ! -f "$dir/data/meta.properties" ]]; then
    format_args=()
    if [[ -f "$dir/format.args" ]]; then
        mapfile -t format_args <"$dir/format.args"
    fi
    java -Dlog4j2.configurationFile="$KAFKA_LOG4J" -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool \
        format --ignore-formatted -t "${cluster_id:-$(java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid)}" \
        -c "$dir/server.properties" "${format_args[@]}" >"$dir/format.log" 2>&1 \
        || { cat "$dir/format.log" >&2; die "formatting the broker's storage in $dir/data failed"; }
fi

# shellcheck disable=SC2086  # the heap options are words
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} \
    -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
    -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties"
