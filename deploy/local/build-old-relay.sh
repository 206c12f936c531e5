#!/usr/bin/env bash
#
# deploy/local/build-old-relay.sh [REV]: builds `outbox-relay` as it was at REV (default: the
# last release without buckets, whose relays hold the one whole-outbox lease) from this
# repository's own history, for the upgrade test (`delivery::upgrade`). Prints the binary's
# path. The build is cached: target/old-relay/<rev>/outbox-relay is reused when present.
#
# The source comes from `git archive` (no network, no worktree); it builds with its own
# Cargo.lock (--locked) into a target directory of its own, so the workspace's binaries are
# untouched. Needs the full history: a shallow clone lacks REV (`git fetch --unshallow`).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REV="${1:-386ee0ba392bc3be272a007bdc4c2efaadf52ee8}"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
OUT="$TARGET/old-relay/$REV"
if [[ -x "$OUT/outbox-relay" ]]; then
    echo "$OUT/outbox-relay"
    exit 0
fi
if ! git cat-file -e "$REV^{commit}" 2>/dev/null; then
    echo "build-old-relay.sh: commit $REV is not in this clone's history (shallow clone? git fetch --unshallow)" >&2
    exit 1
fi
mkdir -p "$OUT"
rm -rf "$OUT/src"
mkdir "$OUT/src"
git archive "$REV" | tar -x -C "$OUT/src"
# Progress to stderr: stdout is the path alone.
(cd "$OUT/src" && CARGO_TARGET_DIR="$OUT/target" cargo build --locked -p outbox-relay --bin outbox-relay >&2)
cp "$OUT/target/debug/outbox-relay" "$OUT/outbox-relay.tmp"
mv "$OUT/outbox-relay.tmp" "$OUT/outbox-relay"
rm -rf "$OUT/src" "$OUT/target"
echo "$OUT/outbox-relay"
