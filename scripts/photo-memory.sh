#!/usr/bin/env bash
# photo-memory.sh — photo memory benchmark (tests/examples/photo_memory.rs): a
# release-built meatspace-api-server on 127.0.0.1 (embedded SQLite) receiving
# UPLOADS concurrent worst-case photo uploads per case (default 4: zero-filled
# 8192x8192 RGBA16 and 39.99 MP RGBA8 PNGs, 12 MP PNG and JPEG); prints the
# answers and the server's peak resident memory (VmHWM) idle and after each
# case, a fresh server per case. Figures, not a test.
#
#   scripts/photo-memory.sh [UPLOADS]
#
# MEATSPACE_PHOTO_DECODE_MEMORY_BYTES, MEATSPACE_MAX_PHOTO_PIXELS and the
# other photo settings in the environment pass through to the server.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
UPLOADS=${1:-4}
# Two invocations: with --example, cargo would build only examples.
cargo build --release --locked -p meatspace-api-server --bin meatspace-api-server >&2
cargo build --release --locked -p meatspace-tests --example photo_memory >&2
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
exec "$TARGET/release/examples/photo_memory" --uploads "$UPLOADS" --server "$TARGET/release/meatspace-api-server"
