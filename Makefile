# Makefile: developer entry points for the outbox relay.
#
#   make deps       install PostgreSQL, Apache Kafka's jars and the Python venv (deploy/local/install-deps.sh)
#   make env-up     deps + start PostgreSQL and Apache Kafka locally (deploy/local/up.sh)
#   make env-down   stop them and remove the state directory (deploy/local/down.sh)
#   make bench      relay benchmark (deploy/local/bench.sh); flags: make bench BENCH_ARGS=--quick
#   make book       the book (docs/) into target/book, links checked (deploy/local/book.sh)
#   make chaos      the whole system under load through faults, then the audit
#                   (deploy/local/chaos.sh); flags: make chaos ARGS="--duration-s 900 --seed 7"
#
# STATE_DIR (default target/local-env) selects the environment's state directory;
# `. target/local-env/env.sh` exports DATABASE_URL, KAFKA_BROKERS, ... afterwards.

STATE_DIR ?= target/local-env

.PHONY: deps env-up env-down

deps:
	bash deploy/local/install-deps.sh

env-up: deps
	bash deploy/local/up.sh "$(STATE_DIR)"

env-down:
	bash deploy/local/down.sh "$(STATE_DIR)"

# The book (docs/, mdBook) into target/book, links checked (deploy/local/book.sh).
.PHONY: book
book: deps
	bash deploy/local/book.sh

# The README's two commands.
.PHONY: demo test
demo:
	bash deploy/local/demo.sh

test:
	bash deploy/local/run-tests.sh

# Relay benchmark: release builds, PostgreSQL + Apache Kafka unless DATABASE_URL /
# KAFKA_BROKERS are set; table on stdout, JSON in target/bench/relay-bench.json.
BENCH_ARGS ?=
.PHONY: bench
bench:
	bash deploy/local/bench.sh $(BENCH_ARGS)

# Chaos run: private PostgreSQL + Apache Kafka behind proxies, the whole system under load
# through a fault schedule, then outbox-audit. Summary on stdout.
ARGS ?=
.PHONY: chaos
chaos:
	bash deploy/local/chaos.sh $(ARGS)
