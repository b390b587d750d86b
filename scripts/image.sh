#!/usr/bin/env bash
# image.sh — build meatspace's container image here, without Docker and
# without a registry, with buildah (vfs storage, chroot isolation), and the
# few images a one-node test cluster needs that would otherwise be pulled.
#
# Usage:
#   image.sh meatspace OUT.tar [TAG]
#       cargo build --release of meatspace-api-server and meatspace-controller
#       (in $CARGO_TARGET_DIR, default ./target) and an image of them, saved as
#       a docker-archive at OUT.tar named meatspace:TAG (default: the chart's
#       appVersion). Prints the image size. The layout is the Dockerfile's:
#       both binaries in /usr/local/bin, the non-root user 10001 (meatspace),
#       /var/lib/meatspace owned by it, the same ENV/WORKDIR/USER/CMD; the only
#       other files are the shared libraries the binaries link (ldd) and
#       /etc/passwd + /etc/group (Kubernetes' runAsNonRoot reads the numeric
#       USER). The revision label is this commit (with "-dirty" when the work
#       tree has changes).
#   image.sh support OUTDIR
#       the test cluster's own images, cached keyed by version under
#       ${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}/images-<key>/ and
#       copied (hard-linked) to OUTDIR:
#         pause.tar       meatspace-test/pause:3.10      the pod sandbox (a static C program)
#         busybox.tar     meatspace-test/busybox:<ver>   the helm test hook (Debian's busybox)
#         postgresql.tar  meatspace-test/postgresql:<ver> the chart's bundled database, from this
#                         machine's Debian PostgreSQL server binaries and their libraries,
#                         with an entry point that reads POSTGRES_USER/DB/PASSWORD and PGDATA
#                         like the official image (and its stop signal, SIGINT: a fast
#                         shutdown, which does not wait for the API's pooled connections)
#       Prints the image references, one per line, as "NAME FILE".
#
# Environment:
#   CARGO_TARGET_DIR       where the release build goes (default ./target)
#   MEATSPACE_IMAGE_BINARIES  a directory with both binaries already built: no
#                          cargo build (the revision label then says nothing
#                          of where they came from); scripts/test gives the
#                          debug binaries it built, so a test run compiles
#                          the workspace once
#   MEATSPACE_TOOLS_CACHE  cache root (default $HOME/.cache/meatspace-tools)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}
APP_UID=10001
PAUSE_VERSION=3.10

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] ERROR: %s\n' "$*" >&2; exit 1; }

command -v buildah >/dev/null || die "buildah is not installed (apt-get install buildah)"
[[ $(id -u) == 0 ]] || die "run as root (buildah with vfs storage and chroot isolation)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-image.XXXXXX")
# buildah keeps its storage in WORK: nothing is left in /var/lib/containers.
cleanup() {
  buildah "${BUILDAH_ARGS[@]}" rm --all >/dev/null 2>&1 || true
  buildah "${BUILDAH_ARGS[@]}" rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
BUILDAH_ARGS=(--storage-driver vfs --root "$WORK/storage" --runroot "$WORK/run")
trap cleanup EXIT
export BUILDAH_ISOLATION=chroot
bh() { buildah "${BUILDAH_ARGS[@]}" "$@"; }

# copy_with_libs ROOTFS FILE... — copy each file to the same path under ROOTFS
# with every shared library it links (ldd), symlinks resolved.
copy_with_libs() {
  local rootfs=$1 f lib; shift
  for f in "$@"; do
    install -D -m 0755 "$f" "$rootfs$f"
    while read -r lib; do
      [[ -n $lib && -e $lib ]] || continue
      [[ -e $rootfs$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
    done < <(ldd "$f" 2>/dev/null | grep -oE '/[^ ]+' || true)
  done
}

# commit ROOTFS NAME OUT.tar CONFIG-ARGS... — an image FROM scratch holding
# ROOTFS (ownership kept), configured, saved as a docker-archive.
commit() {
  local rootfs=$1 name=$2 out=$3; shift 3
  tar --numeric-owner -C "$rootfs" -cf "$WORK/layer.tar" .
  local ctr; ctr=$(bh from scratch)
  bh add "$ctr" "$WORK/layer.tar" / >/dev/null
  bh config "$@" "$ctr"
  bh commit --quiet --rm "$ctr" "$name" >/dev/null
  rm -f "$out" "$WORK/layer.tar"
  bh push --quiet "$name" "docker-archive:$out:$name" >/dev/null
}

passwd_files() {
  local rootfs=$1 user=$2 uid=$3 home=$4
  mkdir -p "$rootfs/etc"
  printf 'root:x:0:0:root:/root:/sbin/nologin\n%s:x:%s:%s::%s:/sbin/nologin\n' "$user" "$uid" "$uid" "$home" >"$rootfs/etc/passwd"
  printf 'root:x:0:\n%s:x:%s:\n' "$user" "$uid" >"$rootfs/etc/group"
}

size_of() { numfmt --to=iec-i --suffix=B "$(stat -c %s "$1")"; }

cmd_meatspace() {
  [[ $# -eq 1 || $# -eq 2 ]] || die "usage: image.sh meatspace OUT.tar [TAG]"
  local out=$1 tag=${2:-}
  [[ -n $tag ]] || tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/deploy/helm/meatspace/Chart.yaml")
  [[ -n $tag ]] || die "no tag given and no appVersion in Chart.yaml"
  local bindir=${MEATSPACE_IMAGE_BINARIES:-}
  if [[ -z $bindir ]]; then
    local target=${CARGO_TARGET_DIR:-$ROOT/target}
    local start=$SECONDS
    log "cargo build --release (target dir $target)"
    (cd "$ROOT" && cargo build --release --locked --bin meatspace-api-server --bin meatspace-controller) \
      || die "cargo build --release failed"
    log "release build: $((SECONDS - start))s"
    bindir=$target/release
  fi

  local rootfs=$WORK/rootfs b
  command -v strip >/dev/null || die "strip is not installed (binutils)"
  for b in meatspace-api-server meatspace-controller; do
    [[ -x $bindir/$b ]] || die "$bindir/$b is missing"
    install -D -m 0755 "$bindir/$b" "$rootfs/usr/local/bin/$b"
    # Debug binaries carry line tables; the image needs none (the symbol
    # table stays, so a backtrace still names its functions).
    strip --strip-debug "$rootfs/usr/local/bin/$b"
  done
  # The libraries the binaries link, at their own paths.
  local lib
  while read -r lib; do
    [[ -e $rootfs$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
  done < <(ldd "$rootfs"/usr/local/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
  passwd_files "$rootfs" meatspace "$APP_UID" /var/lib/meatspace
  install -d -o "$APP_UID" -g "$APP_UID" -m 0750 "$rootfs/var/lib/meatspace"
  install -d -m 1777 "$rootfs/tmp"

  local rev dirty=""
  rev=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
  [[ -z $(git -C "$ROOT" status --porcelain 2>/dev/null) ]] || dirty=-dirty
  commit "$rootfs" "meatspace:$tag" "$out" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env MEATSPACE_DATA_DIR=/var/lib/meatspace \
    --env MEATSPACE_LISTEN_ADDR=0.0.0.0:8080 \
    --env MEATSPACE_PUBLIC_URL=http://localhost:8080 \
    --env MEATSPACE_CONTROLLER_LISTEN_ADDR=0.0.0.0:9091 \
    --workingdir /var/lib/meatspace \
    --user "$APP_UID:$APP_UID" \
    --port 8080 --port 9091 \
    --cmd '["meatspace-api-server"]' \
    --label "org.opencontainers.image.revision=$rev$dirty" \
    --label "org.opencontainers.image.version=$tag"
  log "meatspace:$tag -> $out: $(size_of "$out") (binaries $(du -ch "$rootfs"/usr/local/bin/* | tail -1 | cut -f1), revision $rev$dirty)"
  echo "meatspace:$tag $out"
}

# ---- the test cluster's own images -------------------------------------------
build_pause() {
  local out=$1 rootfs=$WORK/pause
  command -v gcc >/dev/null || die "gcc is needed for the pause image"
  # What Kubernetes' pause does: hold the pod's namespaces, reap zombies, exit on TERM/INT.
  cat >"$WORK/pause.c" <<'EOF'
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &q, NULL);
  sigaction(SIGTERM, &q, NULL);
  sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
EOF
  mkdir -p "$rootfs"
  gcc -static -Os -s -o "$rootfs/pause" "$WORK/pause.c" || die "cannot build the pause program (static libc?)"
  commit "$rootfs" "meatspace-test/pause:$PAUSE_VERSION" "$out" \
    --user 65535:65535 --entrypoint '["/pause"]'
}

build_busybox() {
  local out=$1 ver=$2 rootfs=$WORK/busybox a
  mkdir -p "$rootfs/tmp"
  # Debian's dynamically linked busybox with its libraries: a static glibc
  # program cannot resolve names without the host's NSS modules (wget of
  # the Service's DNS name crashes).
  copy_with_libs "$rootfs" /bin/busybox
  for a in sh grep echo cat sleep nslookup; do ln -s busybox "$rootfs/bin/$a"; done
  # Debian's busybox 1.35 wget crashes (SIGSEGV) on -T, which the chart's
  # test hook passes: the timeout is applied with busybox timeout instead.
  cat >"$rootfs/bin/wget" <<'WGET'
#!/bin/sh
t= skip=
for a do
  shift
  if [ -n "$skip" ]; then t=$a; skip=; continue; fi
  case $a in -T) skip=1; continue ;; -T?*) t=${a#-T}; continue ;; esac
  set -- "$@" "$a"
done
[ -z "$t" ] || exec busybox timeout "$t" busybox wget "$@"
exec busybox wget "$@"
WGET
  chmod 0755 "$rootfs/bin/wget"
  commit "$rootfs" "meatspace-test/busybox:$ver" "$out" --env PATH=/bin --cmd '["sh"]'
}

# The entry point of the PostgreSQL image: what the official image's does for
# the chart's env (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, PGDATA).
PG_ENTRYPOINT=$(cat <<'EOF'
#!/bin/sh
set -eu
: "${PGDATA:?}" "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}" "${POSTGRES_PASSWORD:?}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  chmod 0700 "$PGDATA"
  pw=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
  initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" -E UTF8 --locale=C \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pw"
  printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    echo "CREATE DATABASE \"$POSTGRES_DB\"" | postgres --single -D "$PGDATA" -j postgres >/dev/null
  fi
  echo "initialised $PGDATA"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
EOF
)

build_postgresql() {
  local out=$1 ver=$2 bindir=$3 rootfs=$WORK/postgresql
  local libdir sharedir
  libdir=$("$bindir/pg_config" --pkglibdir 2>/dev/null || echo "${bindir%/bin}/lib")
  sharedir=$("$bindir/pg_config" --sharedir 2>/dev/null || echo "/usr/share/postgresql/${bindir%/bin}")
  [[ -d $libdir && -d $sharedir ]] || die "PostgreSQL lib ($libdir) or share ($sharedir) directory missing"
  copy_with_libs "$rootfs" "$bindir"/{postgres,initdb,pg_ctl,pg_isready,psql} /bin/busybox
  local so
  # Not the LLVM JIT (over 100 MB of libLLVM; jit is off without it).
  for so in "$libdir"/*.so; do [[ $so == */llvmjit* ]] || copy_with_libs "$rootfs" "$so"; done
  mkdir -p "$rootfs$sharedir" "$rootfs/usr/share"
  cp -a "$sharedir/." "$rootfs$sharedir/"
  cp -a /usr/share/zoneinfo "$rootfs/usr/share/"
  local a
  mkdir -p "$rootfs/usr/local/bin"
  for a in sh mktemp mkdir chmod rm cat echo printf; do ln -s /bin/busybox "$rootfs/usr/local/bin/$a"; done
  for a in postgres initdb pg_ctl pg_isready psql; do ln -s "$bindir/$a" "$rootfs/usr/local/bin/$a"; done
  ln -s /usr/local/bin/sh "$rootfs/bin/sh"
  printf '%s\n' "$PG_ENTRYPOINT" >"$rootfs/usr/local/bin/docker-entrypoint.sh"
  chmod 0755 "$rootfs/usr/local/bin/docker-entrypoint.sh"
  passwd_files "$rootfs" postgres 70 /var/lib/postgresql
  install -d -o 70 -g 70 -m 0755 "$rootfs/var/lib/postgresql" "$rootfs/var/run/postgresql"
  install -d -m 1777 "$rootfs/tmp"
  commit "$rootfs" "meatspace-test/postgresql:$ver" "$out" \
    --env PATH=/usr/local/bin:/bin --env TZ=UTC --env LANG=C \
    --user 70:70 --entrypoint '["/usr/local/bin/docker-entrypoint.sh"]' --cmd '[]' --port 5432 \
    --stop-signal SIGINT
}

cmd_support() {
  [[ $# -eq 1 ]] || die "usage: image.sh support OUTDIR"
  local outdir=$1
  mkdir -p "$outdir"
  # Read whole, not through `head`: under pipefail, busybox killed by
  # SIGPIPE once head has its line would fail the check at random.
  local banner
  banner=$( { /bin/busybox --help 2>&1 || true; } )
  [[ -x /bin/busybox && $banner == *BusyBox* ]] \
    || die "/bin/busybox is missing (apt-get install busybox)"
  ldd /bin/busybox >/dev/null 2>&1 || die "/bin/busybox is static: it cannot resolve names in a pod (apt-get install busybox)"
  local bb_ver pg_bin pg_ver
  bb_ver=$(sed -n '1s/^BusyBox v\([0-9.]*\).*/\1/p' <<<"$banner")
  pg_bin=$("$ROOT/scripts/postgres.sh" bindir) || die "no PostgreSQL server binaries (scripts/postgres.sh bindir)"
  pg_ver=$("$pg_bin/postgres" --version | sed -n 's/.* \([0-9][0-9.]*\).*/\1/p')
  # The cache key: the versions and this script (a changed recipe rebuilds).
  local key
  key=$(printf '%s\n' "pause-$PAUSE_VERSION" "busybox-$bb_ver" "postgresql-$pg_ver" \
    | cat - "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
  local cache="$CACHE_ROOT/images-pause-$PAUSE_VERSION-busybox-$bb_ver-postgresql-$pg_ver-$key"
  if [[ ! -f $cache/.done ]]; then
    log "building the pause, busybox $bb_ver and PostgreSQL $pg_ver images into $cache"
    rm -rf "$cache"; mkdir -p "$cache.tmp"
    build_pause "$cache.tmp/pause.tar"
    build_busybox "$cache.tmp/busybox.tar" "$bb_ver"
    build_postgresql "$cache.tmp/postgresql.tar" "$pg_ver" "$pg_bin"
    printf '%s\n' "meatspace-test/pause:$PAUSE_VERSION pause.tar" "meatspace-test/busybox:$bb_ver busybox.tar" \
      "meatspace-test/postgresql:$pg_ver postgresql.tar" >"$cache.tmp/images"
    touch "$cache.tmp/.done"
    mv "$cache.tmp" "$cache"
  fi
  local name file
  while read -r name file; do
    ln -f "$cache/$file" "$outdir/$file" 2>/dev/null || cp "$cache/$file" "$outdir/$file"
    log "$name: $(size_of "$outdir/$file")"
    echo "$name $outdir/$file"
  done <"$cache/images"
}

[[ $# -ge 1 ]] || die "usage: image.sh meatspace OUT.tar [TAG] | image.sh support OUTDIR"
sub=$1; shift
case $sub in
  meatspace) cmd_meatspace "$@" ;;
  support) cmd_support "$@" ;;
  *) die "unknown command $sub (meatspace | support)" ;;
esac
