#!/usr/bin/env bash
#
# deploy/local/install-deps.sh: install what the local dev environment (up.sh)
# and the integration tests need. Idempotent and quick when everything is there:
#
#   - the build's system libraries: OpenSSL's headers (`libssl-dev`, for librdkafka's TLS and
#     SCRAM, and for the PostgreSQL and HTTPS clients) and `pkg-config`, only when
#     `pkg-config --exists openssl` fails; `--build-only` installs just these and stops (what
#     run-tests.sh does before clippy, which compiles);
#   - PostgreSQL server binaries (Debian package `postgresql`), only when no
#     /usr/lib/postgresql/*/bin/initdb exists;
#   - Apache Kafka $KAFKA_VERSION's jars from Maven Central (deploy/local/kafka/pom.xml, the
#     dependency plugin's copy-dependencies) into $CACHE/kafka-<version>/libs, only when the
#     broker's jar is missing there; Java 17 and Maven are installed (Debian openjdk-17-jre-headless,
#     maven) only when missing;
#   - Kafka Connect $CONNECT_VERSION's jars (deploy/local/debezium/connect-pom.xml) into
#     $CACHE/kafka-connect-<version>/libs, and Debezium $DEBEZIUM_VERSION's PostgreSQL connector
#     with its dependencies (deploy/local/debezium/pom.xml; Kafka's and Jackson's jars left to the worker)
#     into $CACHE/debezium-<version>/plugins/debezium-connector-postgres, the worker's
#     plugin.path: the harness's Debezium (deploy/local/debezium-connect.sh), each only when its
#     jar or its `.complete` marker is missing there;
#   - mdBook (crates.io, `cargo install --locked`) into $CACHE/mdbook-<version>, for the book
#     (deploy/local/book.sh), only when missing (about 4 minutes the first time on 2 cores);
#   - a Python venv at $CACHE/venv with a pinned kafka-python, for
#     tests/tools/kafka_tool.py, only when missing or at another version;
#   - in the same venv, pinned check-jsonschema and kubernetes-validate (validation of
#     deploy/compose and deploy/k8s), only when missing or at another version;
#   - in the same venv, a pinned schemathesis (`st`, the API fuzzer of tests/it/security/openapi_fuzz.rs),
#     only when missing or at another version;
#   - in the same venv, a pinned cloudevents SDK (its Kafka binding reads the relay's CloudEvents
#     back in tests/it/publishing/wire_formats.rs), only when missing or at another version;
#   - Prometheus and promtool (Debian package `prometheus`), only when promtool is missing;
#     the package's own service is kept from starting (the tests start their own server);
#   - PgBouncer (Debian package `pgbouncer`), only when the binary is missing; its service is
#     kept from starting too (tests/it/delivery/pgbouncer.rs starts its own on a free port);
#   - the openssl command line tool (Debian package `openssl`), which makes the tests'
#     certificates, only when missing.
#
# Usage: deploy/local/install-deps.sh [--build-only]      (CACHE: see lib.sh)
set -euo pipefail

# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

did=()

# Installs Debian package $1 without letting its service start (it would hold a port our tests
# need, and scrape or pool for nobody); policy-rc.d exit code 101 means "action forbidden" to
# invoke-rc.d. Refreshes the package lists only when the first attempt fails.
apt_install_without_service() {
    local pkg="$1" sudo_cmd=() policy=/usr/sbin/policy-rc.d made_policy=0 ok=1
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $pkg"
        sudo_cmd=(sudo)
    fi
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
        "${sudo_cmd[@]}" chmod +x "$policy"
        made_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 \
        || { "${sudo_cmd[@]}" apt-get update -qq && "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; } \
        || ok=0
    ((made_policy)) && "${sudo_cmd[@]}" rm -f "$policy"
    ((ok)) || die "apt-get install $pkg failed"
    if [[ -d /run/systemd/system ]]; then
        "${sudo_cmd[@]}" systemctl disable --now "$pkg" >/dev/null 2>&1 || true
    fi
}

# --- build libraries: OpenSSL headers and pkg-config ---------------------------------
# rdkafka's `ssl` feature builds librdkafka against the system OpenSSL (found with
# pkg-config); sqlx's and reqwest's `native-tls` link the same library.
if command -v pkg-config >/dev/null && pkg-config --exists openssl; then
    log "openssl headers: present (libssl $(pkg-config --modversion openssl))"
else
    log "openssl headers: missing, installing libssl-dev and pkg-config"
    apt_install_without_service libssl-dev
    apt_install_without_service pkg-config
    pkg-config --exists openssl || die "libssl-dev installed but pkg-config cannot find openssl"
    did+=("installed libssl-dev $(pkg-config --modversion openssl) and pkg-config")
fi
if [[ "${1:-}" == "--build-only" ]]; then
    for d in "${did[@]}"; do log "did: $d"; done
    exit 0
fi

# --- PostgreSQL ---------------------------------------------------------------
if [[ -n "$PG_BIN_DIR" && -x "$PG_BIN_DIR/initdb" ]]; then
    log "postgresql: present ($PG_BIN_DIR)"
else
    log "postgresql: no initdb found, installing the Debian package"
    sudo_cmd=()
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install postgresql"
        sudo_cmd=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq postgresql >/dev/null
    PG_BIN_DIR="$(newest_pg_bin_dir)"
    [[ -x "$PG_BIN_DIR/initdb" ]] || die "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
    # The Debian package starts a cluster of its own on 5432; we never use it,
    # each up.sh runs a throwaway cluster on a free port.
    did+=("installed postgresql ($PG_BIN_DIR)")
fi

# --- Apache Kafka, Kafka Connect, Debezium: jars from Maven Central ------------------------
# Java 17 and Maven, only when missing.
need_java_and_maven() {
    if ! command -v java >/dev/null; then
        log "$1: java missing, installing openjdk-17-jre-headless"
        apt_install_without_service openjdk-17-jre-headless
    fi
    if ! command -v mvn >/dev/null; then
        log "$1: mvn missing, installing maven"
        apt_install_without_service maven
    fi
}

# maven_fetch WHAT POM DEST JAR: the runtime dependencies of POM (copy-dependencies) into DEST,
# through a temporary directory renamed at the end, with a `.complete` marker; fails unless JAR
# is among them. The fetch's log is $CACHE/WHAT-fetch.log.
maven_fetch() {
    local what="$1" pom="$2" dest="$3" jar="$4" tmp fetch_log
    need_java_and_maven "$what"
    tmp="$dest.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    fetch_log="$CACHE/$what-fetch.log"
    if ! mvn -B -q -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$tmp" >"$fetch_log" 2>&1; then
        log_tail "$fetch_log" 40
        rm -rf "$tmp"
        die "fetching $what's jars with maven failed"
    fi
    [[ -f "$tmp/$jar" ]] || die "maven finished but $jar is not in $tmp ($pom and lib.sh disagree?)"
    touch "$tmp/.complete"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    did+=("fetched $what ($(find "$dest" -name '*.jar' | wc -l) jars, $(du -sh "$dest" | cut -f1)) into $dest")
}

kafka_ok() { [[ -f "$KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar" && -f "$KAFKA_LIBS/.complete" ]]; }

if kafka_ok; then
    log "kafka: present ($KAFKA_LIBS)"
else
    log "kafka: fetching Apache Kafka $KAFKA_VERSION from Maven Central into $KAFKA_LIBS"
    maven_fetch kafka "$KAFKA_POM" "$KAFKA_LIBS" "kafka_2.13-$KAFKA_VERSION.jar"
fi

connect_ok() { [[ -f "$CONNECT_LIBS/connect-runtime-$CONNECT_VERSION.jar" && -f "$CONNECT_LIBS/.complete" ]]; }

if connect_ok; then
    log "kafka connect: present ($CONNECT_LIBS)"
else
    log "kafka connect: fetching Kafka Connect $CONNECT_VERSION from Maven Central into $CONNECT_LIBS"
    maven_fetch kafka-connect "$CONNECT_POM" "$CONNECT_LIBS" "connect-runtime-$CONNECT_VERSION.jar"
fi

debezium_plugin="$DEBEZIUM_PLUGIN_PATH/debezium-connector-postgres"
# Present, complete, and without jars the worker gives (Kafka's API, Jackson): a second copy in
# the plugin's class loader would shadow the worker's (deploy/local/debezium/pom.xml says why).
debezium_clashes() {
    local j
    for j in kafka-clients connect-api jackson-core jackson-databind jackson-annotations; do
        compgen -G "$debezium_plugin/$j-[0-9]*.jar" || true
    done
}
debezium_ok() {
    [[ -f "$debezium_plugin/debezium-connector-postgres-$DEBEZIUM_VERSION.jar" && -f "$debezium_plugin/.complete" ]] &&
        [[ -z "$(debezium_clashes)" ]]
}

if debezium_ok; then
    log "debezium: present ($debezium_plugin)"
else
    log "debezium: fetching Debezium $DEBEZIUM_VERSION's PostgreSQL connector from Maven Central into $debezium_plugin"
    mkdir -p "$DEBEZIUM_PLUGIN_PATH"
    maven_fetch debezium "$DEBEZIUM_POM" "$debezium_plugin" "debezium-connector-postgres-$DEBEZIUM_VERSION.jar"
    if ! debezium_ok; then
        rm -f "$debezium_plugin/.complete"
        die "$debezium_plugin holds jars the worker gives ($(debezium_clashes | xargs)): deploy/local/debezium/pom.xml must exclude them"
    fi
fi

# --- mdBook ----------------------------------------------------------------------
if [[ -x "$MDBOOK" ]]; then
    log "mdbook: present ($MDBOOK)"
else
    command -v cargo >/dev/null || die "cargo not found: needed to build mdbook"
    log "mdbook: building mdbook $MDBOOK_VERSION with cargo (a few minutes the first time)"
    mkdir -p "$CACHE"
    if ! cargo install mdbook --version "$MDBOOK_VERSION" --locked \
        --root "$CACHE/mdbook-$MDBOOK_VERSION" >"$CACHE/mdbook-build.log" 2>&1; then
        log_tail "$CACHE/mdbook-build.log" 40
        die "building mdbook failed"
    fi
    did+=("built mdbook $MDBOOK_VERSION ($MDBOOK)")
fi

# --- Python venv with kafka-python -------------------------------------------
venv_ok() {
    [[ -x "$VENV/bin/python" ]] &&
        "$VENV/bin/python" -c 'import sys, kafka, lz4; sys.exit(kafka.__version__ != sys.argv[1])' \
            "$KAFKA_PYTHON_VERSION" 2>/dev/null
}

if venv_ok; then
    log "python venv: present ($VENV, kafka-python $KAFKA_PYTHON_VERSION)"
else
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "python venv: creating $VENV"
        mkdir -p "$CACHE"
        if ! python3 -m venv "$VENV"; then
            # Debian's own python3 ships venv separately.
            [[ "$(id -u)" == 0 ]] || die "python3 -m venv failed: install python3-venv"
            rm -rf "$VENV"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            python3 -m venv "$VENV"
        fi
    fi
    # lz4: the relay compresses with lz4 by default, and kafka-python needs it to decompress.
    log "python venv: installing kafka-python==$KAFKA_PYTHON_VERSION lz4==$LZ4_VERSION"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "kafka-python==$KAFKA_PYTHON_VERSION" "lz4==$LZ4_VERSION"
    venv_ok || die "kafka-python $KAFKA_PYTHON_VERSION not importable from $VENV"
    did+=("python venv $VENV with kafka-python $KAFKA_PYTHON_VERSION")
fi

# --- deployment validators in the venv ------------------------------------------
validators_ok() {
    "$VENV/bin/python" - "$CHECK_JSONSCHEMA_VERSION" "$KUBERNETES_VALIDATE_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
import yaml  # deploy/check_deploy.py; comes with kubernetes-validate
sys.exit(not (version("check-jsonschema") == sys.argv[1] and version("kubernetes-validate") == sys.argv[2]))
PY
}

if validators_ok; then
    log "python venv: check-jsonschema $CHECK_JSONSCHEMA_VERSION, kubernetes-validate $KUBERNETES_VALIDATE_VERSION present"
else
    log "python venv: installing check-jsonschema==$CHECK_JSONSCHEMA_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "check-jsonschema==$CHECK_JSONSCHEMA_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    validators_ok || die "check-jsonschema / kubernetes-validate not installed in $VENV"
    did+=("check-jsonschema $CHECK_JSONSCHEMA_VERSION and kubernetes-validate $KUBERNETES_VALIDATE_VERSION in $VENV")
fi

# --- the CloudEvents SDK in the venv ------------------------------------------------
cloudevents_ok() {
    "$VENV/bin/python" - "$CLOUDEVENTS_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
import cloudevents.kafka  # the Kafka protocol binding the tests read messages with
sys.exit(not version("cloudevents") == sys.argv[1])
PY
}

if cloudevents_ok; then
    log "python venv: cloudevents $CLOUDEVENTS_VERSION present"
else
    log "python venv: installing cloudevents==$CLOUDEVENTS_VERSION"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "cloudevents==$CLOUDEVENTS_VERSION"
    cloudevents_ok || die "cloudevents $CLOUDEVENTS_VERSION not installed in $VENV"
    did+=("cloudevents $CLOUDEVENTS_VERSION in $VENV")
fi

# --- API fuzzer in the venv ------------------------------------------------------
schemathesis_ok() {
    "$VENV/bin/python" - "$SCHEMATHESIS_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(not version("schemathesis") == sys.argv[1])
PY
}

if schemathesis_ok && [[ -x "$VENV/bin/st" ]]; then
    log "python venv: schemathesis $SCHEMATHESIS_VERSION present"
else
    log "python venv: installing schemathesis==$SCHEMATHESIS_VERSION"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "schemathesis==$SCHEMATHESIS_VERSION"
    schemathesis_ok || die "schemathesis $SCHEMATHESIS_VERSION not installed in $VENV"
    did+=("schemathesis $SCHEMATHESIS_VERSION in $VENV")
fi

# --- Prometheus and promtool ----------------------------------------------------
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
    log "prometheus: present ($(command -v prometheus), $(command -v promtool))"
else
    log "prometheus: promtool missing, installing the Debian package"
    apt_install_without_service prometheus
    command -v promtool >/dev/null || die "prometheus installed but promtool is not on PATH"
    did+=("installed prometheus and promtool ($(promtool --version 2>&1 | head -n 1))")
fi

# --- PgBouncer -------------------------------------------------------------------
if command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]]; then
    log "pgbouncer: present ($(command -v pgbouncer || echo /usr/sbin/pgbouncer))"
else
    log "pgbouncer: missing, installing the Debian package"
    apt_install_without_service pgbouncer
    [[ -x /usr/sbin/pgbouncer ]] || command -v pgbouncer >/dev/null \
        || die "pgbouncer installed but not found"
    did+=("installed pgbouncer ($(/usr/sbin/pgbouncer --version 2>&1 | head -n 1))")
fi

# --- openssl (the secured-connection tests' certificates) ----------------------------
if command -v openssl >/dev/null; then
    log "openssl: present ($(openssl version))"
else
    log "openssl: missing, installing the Debian package"
    apt_install_without_service openssl
    did+=("installed openssl")
fi

if ((${#did[@]} == 0)); then
    log "nothing to do: all dependencies present"
else
    for d in "${did[@]}"; do log "did: $d"; done
fi
