#!/usr/bin/env bash
# sse-fanout.sh — SSE fan-out benchmark (tests/examples/sse_fanout.rs): a
# release-built meatspace-api-server on 127.0.0.1 (embedded SQLite) holding
# STREAMS idle event streams (default 10000); prints its memory (VmRSS) idle
# and with every stream open, and the time for one event to reach them all.
# Figures, not a test.
#
#   scripts/sse-fanout.sh [STREAMS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STREAMS=${1:-10000}
# One descriptor per stream on each side, plus the server's own.
ulimit -n "$((STREAMS * 2 + 1024))" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
echo "[sse-fanout] open-file limit: $(ulimit -n)" >&2
cargo build --release --locked -p meatspace-api-server -p meatspace-tests --example sse_fanout >&2
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
exec "$TARGET/release/examples/sse_fanout" --streams "$STREAMS" --server "$TARGET/release/meatspace-api-server"
