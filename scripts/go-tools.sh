# go-tools.sh — what scripts/k8s-tools.sh and scripts/node-tools.sh share: the
# Go toolchain and build environment, one build lock per script, and the
# wrapper modules through which the commands of other Go modules are built at
# pinned versions. Sourced, not run: the caller defines log, die, CACHE_ROOT
# and NICE_LEVEL first.

find_go() {
  if [[ -n ${GO:-} ]]; then echo "$GO"; return; fi
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return; fi
  return 1
}

# go_setup LOCK SCRATCH — finds Go (GO_CMD), sets the build environment, waits
# for $CACHE_ROOT/LOCK (parallel test jobs may all call the same script) and
# makes a scratch directory WORK_ROOT, removed on exit.
go_setup() {
  GO_CMD=$(find_go) || die "no Go toolchain found (set GO=/path/to/go)"
  log "using $GO_CMD ($("$GO_CMD" version))"
  # Static, reproducible-ish builds; modules resolved from go.mod files we
  # write. -dwarf=false: the binaries are linked with -w (no DWARF) anyway,
  # and the compiler would otherwise still generate it for every package.
  export CGO_ENABLED=0
  export GOFLAGS="-mod=mod -buildvcs=false -gcflags=all=-dwarf=false"
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/$1"
  flock 9
  WORK_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/$2.XXXXXX")
  trap 'rm -rf "$WORK_ROOT"' EXIT
}

gobuild() { nice -n "$NICE_LEVEL" "$GO_CMD" "$@"; }

# enter_module NAME — makes and enters a new, empty Go module
# meatspace.local/tools/NAME in WORK_ROOT, with an out/ directory for what is
# built in it. Called in the subshell of one build, which it times.
enter_module() {
  BUILD_START=$SECONDS
  mkdir -p "$WORK_ROOT/$1/out"
  cd "$WORK_ROOT/$1"
  "$GO_CMD" mod init "meatspace.local/tools/$1" 2>/dev/null
}

# require_tools MODULE VERSION PACKAGE... — the module entered requires MODULE
# at VERSION and names each PACKAGE as a tool; then it is tidied.
require_tools() {
  local mod=$1 ver=$2 p
  shift 2
  {
    printf '\nrequire %s %s\n\n' "$mod" "$ver"
    for p in "$@"; do echo "tool $p"; done
  } >>go.mod
  tidy
}

# require_kubernetes COMMAND... — the module entered requires
# k8s.io/kubernetes at KUBERNETES_VERSION with each k8s.io/kubernetes/cmd/COMMAND
# as a tool. k8s.io/kubernetes replaces every staging module (k8s.io/api,
# k8s.io/client-go, ...) with ./staging/src/... paths, which `go install
# pkg@version` refuses and a dependency's replace directives cannot give, so
# the wrapper maps each staging module to its published v0.<minor>.<patch>
# release and keeps upstream's default GODEBUG settings.
require_kubernetes() {
  local ver=$KUBERNETES_VERSION kmod staging m c
  local staging_ver="v0.${ver#v1.}"
  "$GO_CMD" mod download -json "k8s.io/kubernetes@$ver" >dl.json \
    || die "go mod download k8s.io/kubernetes@$ver failed"
  kmod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' dl.json | head -1)
  [[ -f $kmod ]] || die "could not locate go.mod of k8s.io/kubernetes@$ver"
  # Every "k8s.io/X => ./staging/src/k8s.io/X" line becomes "k8s.io/X => k8s.io/X <staging_ver>".
  staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$kmod")
  [[ -n $staging ]] || die "no staging replace directives found in $kmod"
  {
    printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$ver"
    for m in $staging; do echo "	$m => $m $staging_ver"; done
    printf ')\n\n'
    for c in "$@"; do echo "tool k8s.io/kubernetes/cmd/$c"; done
    sed -n 's/^godebug /godebug /p' "$kmod"
  } >>go.mod
  log "$(basename "$PWD") wrapper: $(wc -w <<<"$staging") staging modules replaced"
  tidy
}

tidy() {
  gobuild mod tidy || die "go mod tidy failed for the $(basename "$PWD") wrapper"
}

# kubernetes_ldflags — the linker flags of a Kubernetes command: stripped, with
# the version stamping of upstream's hack/lib/version.sh.
kubernetes_ldflags() {
  local ver=$KUBERNETES_VERSION minor ldflags="-s -w" kv pkg
  minor=${ver#v1.}; minor=${minor%%.*}
  for kv in "gitVersion=$ver" gitMajor=1 "gitMinor=$minor" gitTreeState=clean \
            buildDate=1970-01-01T00:00:00Z; do
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.$kv"
    done
  done
  echo "$ldflags"
}

# cache_binaries TO NAME... — moves each binary NAME built into out/ to the
# cache directory TO; a missing one fails the build.
cache_binaries() {
  local to=$1 b
  shift
  mkdir -p "$to"
  for b in "$@"; do
    [[ -x out/$b ]] || die "build produced no $b"
    mv -f "out/$b" "$to/$b"
  done
  log "$* built in $((SECONDS - BUILD_START))s, cached in $to"
}
