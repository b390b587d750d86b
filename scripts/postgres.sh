#!/usr/bin/env bash
# postgres.sh — a throwaway PostgreSQL server for the meatspace tests, started
# from the machine's own binaries (initdb, pg_ctl, postgres) in a directory of
# your choice, listening on a free port of 127.0.0.1 and on a unix socket in
# that directory. Trust authentication and fsync=off: for tests only, never
# for data you want to keep.
#
# Usage:
#   postgres.sh start DIR   initdb in DIR/data, start the server, wait until it
#                           accepts connections, write DIR/env and print it on
#                           stdout (use: eval "$(postgres.sh start DIR)")
#   postgres.sh env DIR     print DIR/env
#   postgres.sh bindir      print the directory of the server binaries it would
#                           use, or fail if there are none
#   postgres.sh stop DIR    stop the server and remove DIR
#   postgres.sh crash DIR   SIGKILL the postmaster (as a crash would), wait
#                           until it is gone; the data directory stays
#   postgres.sh restart DIR start the server again on the same data directory
#                           and port (after crash), wait until it accepts
#                           connections
#
# DIR/env exports MEATSPACE_TEST_POSTGRES_URL (the admin URL the test harness
# reads) and MEATSPACE_TEST_PG_BIN (the server's bin directory, so tests use
# the matching pg_dump).
#
# Run as root, the server runs as the `postgres` system user (initdb refuses
# root) and DIR is handed to that user.
#
# Environment:
#   MEATSPACE_PG_BIN            directory with initdb, pg_ctl and postgres
#                               (default: `pg_config --bindir`, else the newest
#                               /usr/lib/postgresql/*/bin)
#   MEATSPACE_PG_READY_TIMEOUT  seconds to wait for the server (default 60)
#   MEATSPACE_PG_MAX_CONNECTIONS  max_connections (default 300)
#   MEATSPACE_PG_SYNCHRONOUS_COMMIT  synchronous_commit (default off). The
#                               crash tests set it on: with it off a commit
#                               is acknowledged before its WAL leaves shared
#                               memory, and a SIGKILLed server loses it
#                               (fsync=off is fine there: the OS page cache
#                               outlives a process crash)
set -euo pipefail

LOG_PREFIX=postgres
# shellcheck source=service-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"

MARKER=.meatspace-postgres
READY_TIMEOUT=${MEATSPACE_PG_READY_TIMEOUT:-60}
MAX_CONNECTIONS=${MEATSPACE_PG_MAX_CONNECTIONS:-300}
SYNCHRONOUS_COMMIT=${MEATSPACE_PG_SYNCHRONOUS_COMMIT:-off}
RUN_AS=postgres   # the system user the server runs as when we are root



# The directory holding initdb, pg_ctl and postgres.
find_bin() {
  local candidate
  local -a candidates=()
  if [[ -n ${MEATSPACE_PG_BIN:-} ]]; then
    candidates=("$MEATSPACE_PG_BIN")   # asked for explicitly: nothing else will do
  elif command -v pg_config >/dev/null 2>&1; then
    candidate=$(pg_config --bindir 2>/dev/null || true)
    [[ -n $candidate ]] && candidates+=("$candidate")
  fi
  if [[ -z ${MEATSPACE_PG_BIN:-} ]]; then
    # Debian keeps server binaries per major version; newest first.
    while IFS= read -r candidate; do
      candidates+=("$candidate")
    done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -t/ -k4,4 -rV)
  fi
  for candidate in "${candidates[@]}"; do
    if [[ -x $candidate/initdb && -x $candidate/pg_ctl && -x $candidate/postgres ]]; then
      echo "$candidate"
      return 0
    fi
  done
  die "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found in: ${candidates[*]:-nothing}." \
    "Install the server package (Debian: apt-get install postgresql-15) or set MEATSPACE_PG_BIN."
}

# A TCP port on 127.0.0.1 that nothing is listening on.
free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$(( 10000 + (RANDOM * 32768 + RANDOM) % 22000 ))  # below the ephemeral range
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  die "could not find a free port on 127.0.0.1"
}

# as_server CMD... — run CMD as the user the server runs as, from DIR (the
# postgres user may not be allowed into the caller's working directory).
as_server() {
  if [[ $EUID -eq 0 ]]; then
    (cd "$DIR" && "$RUNUSER" -u "$RUN_AS" -- "$@")
  else
    (cd "$DIR" && "$@")
  fi
}

# running PID — true while PID exists and is not a zombie.
running() {
  [[ -r /proc/$1/stat ]] && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]
}

# The postmaster's pid if it runs from DIR/data, else nothing.
postmaster_pid() {
  local pidfile=$DIR/data/postmaster.pid pid
  [[ -f $pidfile ]] || return 1
  pid=$(head -n 1 "$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] && running "$pid" || return 1
  # Guard against pid reuse: it must be a postgres process.
  tr '\0' '\n' <"/proc/$pid/cmdline" | head -n 1 | grep -q 'postgres$' || return 1
  echo "$pid"
}

cmd_start() {
  [[ $# -eq 1 ]] || usage
  DIR=$(abspath "$1")
  if postmaster_pid >/dev/null; then
    die "a server is already running in $DIR (use: $0 stop $DIR)"
  fi
  [[ -e $DIR/data ]] && die "$DIR/data already exists; use an empty directory"
  touch "$DIR/$MARKER"

  local bin; bin=$(find_bin)
  local version; version=$("$bin/postgres" --version)
  if [[ $EUID -eq 0 ]]; then
    RUNUSER=$(command -v runuser || echo /usr/sbin/runuser)
    [[ -x $RUNUSER ]] || die "running as root, but runuser (util-linux) is missing"
    id "$RUN_AS" >/dev/null 2>&1 \
      || die "running as root, but there is no '$RUN_AS' user to run the server as (initdb refuses root)"
    chown "$RUN_AS:" "$DIR" "$DIR/$MARKER"
    "$RUNUSER" -u "$RUN_AS" -- test -w "$DIR" \
      || die "user '$RUN_AS' cannot write to $DIR (is a parent directory private?); choose a DIR under /tmp"
  fi

  local t0=$SECONDS
  log "initdb in $DIR/data ($version, $bin)"
  as_server "$bin/initdb" --pgdata="$DIR/data" --username=postgres --auth=trust \
    --encoding=UTF8 --locale=C --no-sync >"$DIR/initdb.log" 2>&1 \
    || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }

  local port started=false
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    # A unix socket path is limited to 107 bytes.
    (( ${#DIR} + 20 < 107 )) || die "DIR path too long for a unix socket: $DIR"
    # Settings for a disposable test server: no durability, many connections
    # (each test opens its own pool), everything on loopback.
    cat >"$DIR/data/postgresql.auto.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$DIR'
max_connections = $MAX_CONNECTIONS
fsync = off
synchronous_commit = $SYNCHRONOUS_COMMIT
full_page_writes = off
shared_buffers = '128MB'
log_min_messages = warning
EOF
    chown --reference="$DIR/data/postgresql.conf" "$DIR/data/postgresql.auto.conf"
    if as_server "$bin/pg_ctl" --pgdata="$DIR/data" --log="$DIR/postgres.log" \
        --wait --timeout="$READY_TIMEOUT" start >/dev/null; then
      started=true
      break
    fi
    # Another process may have taken the port between the check and the bind.
    if grep -q 'could not bind\|Address already in use' "$DIR/postgres.log" 2>/dev/null; then
      log "port $port was taken; trying another"
      continue
    fi
    break
  done
  if ! $started; then
    tail -n 40 "$DIR/postgres.log" >&2 2>/dev/null || true
    die "the server did not start (log: $DIR/postgres.log)"
  fi

  local isready=$bin/pg_isready
  [[ -x $isready ]] || isready=pg_isready
  local deadline=$((SECONDS + READY_TIMEOUT))
  until "$isready" --quiet --host=127.0.0.1 --port="$port" --username=postgres --dbname=postgres; do
    (( SECONDS < deadline )) || die "the server does not accept connections on 127.0.0.1:$port after ${READY_TIMEOUT}s"
    sleep 0.2
  done

  write_env "$DIR/env" "meatspace test PostgreSQL in $DIR" \
    "MEATSPACE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$port/postgres" \
    "MEATSPACE_TEST_PG_BIN=$bin" "MEATSPACE_PG_DIR=$DIR"
  log "ready in $((SECONDS - t0))s on 127.0.0.1:$port (source $DIR/env)"
  cat "$DIR/env"
}

cmd_stop() {
  [[ $# -eq 1 ]] || usage
  [[ -d $1 ]] || { log "$1 does not exist; nothing to stop"; return 0; }
  DIR=$(abspath "$1")
  [[ -f $DIR/$MARKER ]] || die "$DIR was not created by $0 start; refusing to remove it"
  local pid
  if pid=$(postmaster_pid); then
    # SIGINT is PostgreSQL's fast shutdown (what `pg_ctl stop -m fast` sends);
    # SIGQUIT its immediate shutdown; SIGKILL the last resort.
    local sig
    for sig in INT QUIT KILL; do
      kill -"$sig" "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do running "$pid" || break; sleep 0.1; done
      running "$pid" || break
      log "postgres (pid $pid) still runs after SIG$sig"
    done
  fi
  rm -rf "$DIR"
  log "stopped and removed $DIR"
}

cmd_crash() {
  [[ $# -eq 1 ]] || usage
  DIR=$(abspath "$1")
  [[ -f $DIR/$MARKER ]] || die "$DIR was not created by $0 start"
  local pid
  pid=$(postmaster_pid) || die "no server runs in $DIR"
  kill -KILL "$pid"
  for _ in $(seq 1 100); do running "$pid" || break; sleep 0.05; done
  running "$pid" && die "postgres (pid $pid) survived SIGKILL"
  # Backends orphaned by the postmaster's death exit when they notice it;
  # the restart waits for them through the shared memory check.
  log "crashed postgres (pid $pid) in $DIR"
}

cmd_restart() {
  [[ $# -eq 1 ]] || usage
  DIR=$(abspath "$1")
  [[ -f $DIR/$MARKER ]] || die "$DIR was not created by $0 start"
  postmaster_pid >/dev/null && die "a server already runs in $DIR"
  local bin; bin=$(find_bin)
  if [[ $EUID -eq 0 ]]; then
    RUNUSER=$(command -v runuser || echo /usr/sbin/runuser)
  fi
  local port; port=$(sed -n 's/^port = //p' "$DIR/data/postgresql.auto.conf")
  # Orphaned backends of a crashed postmaster may hold the shared memory a
  # few moments: retry until the server starts.
  local deadline=$((SECONDS + READY_TIMEOUT))
  until as_server "$bin/pg_ctl" --pgdata="$DIR/data" --log="$DIR/postgres.log" \
      --wait --timeout="$READY_TIMEOUT" start >/dev/null 2>&1; do
    (( SECONDS < deadline )) || { tail -n 20 "$DIR/postgres.log" >&2; die "restart failed"; }
    sleep 0.1
  done
  local isready=$bin/pg_isready
  [[ -x $isready ]] || isready=pg_isready
  until "$isready" --quiet --host=127.0.0.1 --port="$port" --username=postgres --dbname=postgres; do
    (( SECONDS < deadline )) || die "the server does not accept connections after restart"
    sleep 0.05
  done
  log "restarted on 127.0.0.1:$port"
}

cmd_bindir() {
  [[ $# -eq 0 ]] || usage
  find_bin
}

run_subcommand "$@"
