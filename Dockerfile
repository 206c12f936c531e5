# syntax=docker/dockerfile:1
#
# One image with the project's binaries: outbox-relay (the default command), order-service,
# wms-consumer and stock-consumer (override the command to run one of them), the outbox-audit
# tool (reconciles a deployment), and the mint-token tool (signs bearer tokens for trials;
# production tokens come from the IdP).
#
#   docker build -t outbox-relay .
#   docker run --rm -e DATABASE_URL=... -e KAFKA_BROKERS=... outbox-relay run
#   docker run --rm --entrypoint order-service -e DATABASE_URL=... outbox-relay
#
# Written and checked statically (tests/it/operations/deploy.rs: every binary, path and flag named here
# exists in the workspace); not built on the project's machines, which have no Docker engine.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# --- builder ------------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
# rdkafka 0.39 (features tokio and ssl; no gssapi, sasl, curl or cmake-build in Cargo.toml)
# builds librdkafka statically from its vendored source with its own configure script and
# make, against the system's OpenSSL (TLS, SCRAM) and zlib: a C/C++ toolchain, make,
# pkg-config, OpenSSL's and zlib's headers. sqlx and reqwest (native-tls) link the same
# OpenSSL. The rust image has them; listed so a change of base image keeps working.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential pkg-config libssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole workspace: every member must be present for cargo, and the sqlx::migrate! macros
# embed migrations/ into the binaries at compile time.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && mkdir -p /out \
    && cp target/release/outbox-relay target/release/order-service \
          target/release/wms-consumer target/release/stock-consumer \
          target/release/outbox-audit target/release/mint-token /out/

# --- runtime ------------------------------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim
# librdkafka is linked statically; at run time it needs glibc, libstdc++, zlib and OpenSSL's
# libssl3 (dynamically linked, so the distribution's security updates reach it: rebuild the
# image on top of an updated base). ca-certificates is the trust store Kafka, PostgreSQL and
# HTTPS connections use when no CA file is configured; curl for the HEALTHCHECK and for
# compose's health checks of the services.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl libssl3 libstdc++6 zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 outbox \
    && useradd --system --uid 10001 --gid outbox --no-create-home --shell /usr/sbin/nologin outbox
COPY --from=builder /out/ /usr/local/bin/
USER 10001:10001
# Inside a container the servers must listen on every interface (the binaries default to
# 127.0.0.1). The relay's METRICS_ADDR is also what the HEALTHCHECK probes.
ENV METRICS_ADDR=0.0.0.0:9187 \
    LISTEN_ADDR=0.0.0.0:8080 \
    LOG_FORMAT=json \
    RUST_LOG=info,sqlx=warn,rdkafka=warn
EXPOSE 9187 8080
# /healthz answers 200 on a hot standby too, and 503 while the leader cannot reach the database
# or the broker. Services run from this image override the command and their health check
# (their /healthz is on LISTEN_ADDR): see deploy/compose/compose.yaml.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${METRICS_ADDR##*:}/healthz" >/dev/null || exit 1
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
