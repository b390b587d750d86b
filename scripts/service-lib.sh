# service-lib.sh — what the scripts that start and stop a throwaway service for
# the tests share (postgres.sh, control-plane.sh, cluster.sh): their messages,
# their usage text (the script's header comment), the env file a start writes
# and the dispatch of subcommands. Sourced after setting LOG_PREFIX.

log() { printf '[%s] %s\n' "$LOG_PREFIX" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$LOG_PREFIX" "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2; exit 2; }
abspath() { mkdir -p "$1" && (cd "$1" && pwd); }

# write_env FILE WHAT NAME=VALUE... — FILE, to be sourced: a comment naming
# WHAT, then an export of each NAME, its VALUE quoted for the shell.
write_env() {
  local file=$1 what=$2 kv
  shift 2
  {
    echo "# $what — source this file"
    for kv in "$@"; do printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"; done
  } >"$file"
}

# cmd_env DIR — the `env` subcommand: prints the env file the start wrote.
cmd_env() {
  [[ $# -eq 1 ]] || usage
  [[ -f $1/env ]] || die "no env file in $1 (is it started there?)"
  cat "$1/env"
}

# run_subcommand SUBCOMMAND ARGS... — runs the function cmd_SUBCOMMAND (dashes
# as underscores) with ARGS; anything else prints the usage.
run_subcommand() {
  [[ $# -ge 1 ]] || usage
  local fn=cmd_${1//-/_}
  shift
  [[ $(type -t "$fn") == function ]] || usage
  "$fn" "$@"
}

# make_ca CN DAYS — ca.key and ca.crt of a new certificate authority (EC
# P-256) named CN, in the current directory.
make_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca.key -out ca.crt -days "$2" -subj "/CN=$1" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
}

# sign_cert NAME SUBJECT DAYS EXTENSIONS — NAME.key and NAME.crt, signed by
# the CA in the current directory, with EXTENSIONS (the lines of an openssl
# extension file).
sign_cert() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  printf '%s\n' "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$1.crt" -days "$3" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
