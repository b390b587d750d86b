#!/usr/bin/env bash
# bench.sh — load benchmark of the API server (tests/examples/api_load.rs):
# the real meatspace-api-server binary on SQLite and on PostgreSQL, driven
# over 127.0.0.1 by concurrent clients; prints requests/s, latency
# percentiles, errors, CPU split and the server's memory. Figures, not a test.
#
#   scripts/bench.sh [ARGS...]
#
# ARGS go to the benchmark: --clients N (default 32), --duration SECS per
# scenario (default 10), --warmup SECS (default 1), --backend
# sqlite|postgres|both (default both).
#
# Environment:
#   MEATSPACE_BENCH_PROFILE      release (default) or debug: how the server and
#                                the benchmark are built
#   MEATSPACE_TEST_POSTGRES_URL  admin URL of a PostgreSQL server to use; when
#                                unset, a throwaway one is started with
#                                scripts/postgres.sh and stopped at the end
#   MEATSPACE_BENCH_CLIENTS, MEATSPACE_BENCH_DURATION, MEATSPACE_BENCH_WARMUP,
#   MEATSPACE_BENCH_BACKEND      defaults for the flags above
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPTS=$ROOT/scripts
cd "$ROOT"

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

PROFILE=${MEATSPACE_BENCH_PROFILE:-release}
case $PROFILE in
  release) PROFILE_FLAGS=(--release) ;;
  debug) PROFILE_FLAGS=() ;;
  *) die "MEATSPACE_BENCH_PROFILE must be release or debug, not '$PROFILE'" ;;
esac

# Does this run need PostgreSQL? (--backend sqlite is the only way it does not.)
backend=${MEATSPACE_BENCH_BACKEND:-both}
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --backend) backend=${args[i + 1]:-} ;;
    --backend=*) backend=${args[i]#--backend=} ;;
  esac
done

PG_DIR=""
cleanup() {
  local rc=$?
  trap - EXIT
  if [[ -n $PG_DIR ]]; then
    "$SCRIPTS/postgres.sh" stop "$PG_DIR" || rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
# Signals end the script through the EXIT trap, so PostgreSQL is stopped.
trap 'exit 130' INT
trap 'exit 143' TERM

log "building ($PROFILE): meatspace-api-server and the api_load example"
cargo build "${PROFILE_FLAGS[@]}" --locked -p meatspace-api-server -p meatspace-tests --example api_load

if [[ $backend != sqlite && -z ${MEATSPACE_TEST_POSTGRES_URL:-} ]]; then
  log "starting a throwaway PostgreSQL server"
  PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-bench-pg.XXXXXX")
  "$SCRIPTS/postgres.sh" start "$PG_DIR" >/dev/null
  # shellcheck disable=SC1091 # written by postgres.sh
  source "$PG_DIR/env"
fi

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
"$TARGET/examples/api_load" --server "$TARGET/meatspace-api-server" "$@"
