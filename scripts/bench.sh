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
# Comparison mode (tests/examples/api_load/compare.rs):
#
#   scripts/bench.sh --compare [--large] [ARGS...]
#
# drives the server with wrk (installed with apt-get when missing) through an
# empty poll (also after a restart), a create and whole task lifecycles;
# runs pgbench with the SQL the server issued for one poll, one create and
# one lifecycle, captured from PostgreSQL's statement log (so PostgreSQL is
# always the throwaway server started here, with its log); runs SQLite
# natively on the create's row; serves the poll's answer from a bare hyper
# service and from nginx (installed when missing) as the HTTP limit; prints
# each pair and its ratio. --large first
# preloads 1M tasks and 10M events into each database (minutes).
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
compare=false
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --compare | --large) compare=true ;;
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
cargo build "${PROFILE_FLAGS[@]}" --locked -p meatspace-api-server -p meatspace-tests \
  --bin meatspace-api-server --example api_load

if $compare; then
  # wrk drives every row; nginx is one of the two HTTP limits (the other,
  # a bare hyper service, is built in); sqlite3 runs the create natively.
  for tool in wrk nginx sqlite3; do
    command -v "$tool" >/dev/null 2>&1 && continue
    log "installing $tool (apt-get)"
    if [[ $EUID -eq 0 ]]; then SUDO=(); else SUDO=(sudo); fi
    "${SUDO[@]}" apt-get install -y "$tool" >/dev/null 2>&1 \
      || { "${SUDO[@]}" apt-get update >/dev/null && "${SUDO[@]}" apt-get install -y "$tool" >/dev/null; } \
      || die "could not install $tool; install it (Debian: apt-get install $tool) and run again"
  done
  # Debian's package starts a system nginx on port 80; the comparison runs
  # its own on 127.0.0.1 and needs none.
  if [[ -x /usr/sbin/nginx ]] && ! command -v nginx >/dev/null 2>&1; then
    PATH=$PATH:/usr/sbin
  fi
  # The capture reads the statement log of a server this script started.
  unset MEATSPACE_TEST_POSTGRES_URL
fi

if [[ $backend != sqlite && -z ${MEATSPACE_TEST_POSTGRES_URL:-} ]]; then
  log "starting a throwaway PostgreSQL server"
  PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-bench-pg.XXXXXX")
  "$SCRIPTS/postgres.sh" start "$PG_DIR" >/dev/null
  # shellcheck disable=SC1091 # written by postgres.sh
  source "$PG_DIR/env"
fi

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
"$TARGET/examples/api_load" --server "$TARGET/meatspace-api-server" "$@"
