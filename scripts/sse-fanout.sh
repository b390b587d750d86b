#!/usr/bin/env bash
# sse-fanout.sh — SSE fan-out benchmark (tests/examples/sse_fanout.rs): a
# release-built meatspace-api-server on 127.0.0.1 (embedded SQLite) holding
# STREAMS idle event streams (default 10000), or as many idle long polls
# (MODE longpoll); prints its memory (VmRSS) idle and with every stream open,
# and the time for one event to reach them all. Figures, not a test.
#
#   scripts/sse-fanout.sh [STREAMS] [sse|longpoll] [HTTP2_CONNECTIONS]
#
# With HTTP2_CONNECTIONS, the streams share that many HTTP/2 connections
# (prior knowledge) instead of one HTTP/1.1 connection each.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STREAMS=${1:-10000}
MODE=${2:-sse}
HTTP2=()
if [[ -n ${3:-} ]]; then HTTP2=(--http2 "$3"); fi
# One descriptor per stream on each side, plus the server's own.
ulimit -n "$((STREAMS * 2 + 1024))" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
echo "[sse-fanout] open-file limit: $(ulimit -n)" >&2
# Two invocations: with --example, cargo would build only examples.
cargo build --release --locked -p meatspace-api-server --bin meatspace-api-server >&2
cargo build --release --locked -p meatspace-tests --example sse_fanout >&2
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
exec "$TARGET/release/examples/sse_fanout" --streams "$STREAMS" --mode "$MODE" "${HTTP2[@]}" --server "$TARGET/release/meatspace-api-server"
