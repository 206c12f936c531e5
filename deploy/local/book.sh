#!/usr/bin/env bash
#
# deploy/local/book.sh: checks the index from the guarantees to their tests, builds the book
# (docs/, mdBook, into target/book) and checks its links.
#
#  1. docs/check-guarantees.py: every guarantee of docs/src/guarantees.md cites tests that
#     exist; README.md lists the same guarantees; docs/src/testing.md's folder table lists every
#     file of tests/it; the folders (testing.md, tests/it/main.rs) and the test files' docs name
#     the guarantees that cite their tests;
#  2. docs/check-links.py: every relative link of the built pages, the Markdown files outside
#     the book (README, the changelog, the crates' READMEs, the dated reports) and every
#     alert's runbook link.
#
# `make book` and `make test` run it; a moved section cannot leave a dead link behind, nor a
# renamed test a guarantee without its proof. Needs mdbook (deploy/local/install-deps.sh puts
# it in the cache).
set -euo pipefail

# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

python3 docs/check-guarantees.py
[[ -x "$MDBOOK" ]] || die "no mdbook at $MDBOOK: run deploy/local/install-deps.sh"
"$MDBOOK" build docs >/dev/null 2>target/book-build.log \
    || { cat target/book-build.log >&2; die "mdbook build docs failed"; }
python3 docs/check-links.py target/book --runbooks deploy/prometheus/alerts.yaml \
    README.md CHANGELOG.md relay/README.md services/*/README.md relay/bench/reports/*.md tests/chaos-reports/*.md
log "book: target/book/index.html, every guarantee cites existing tests, no dead link"
