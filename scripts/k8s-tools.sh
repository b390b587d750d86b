#!/usr/bin/env bash
# k8s-tools.sh — build (from Go module sources) and cache the binaries that the
# meatspace tests need for a throwaway Kubernetes control plane, the way
# controller-runtime's envtest uses them: etcd, kube-apiserver and helm.
#
# Usage:   BIN=$(scripts/k8s-tools.sh | tail -1)
#          scripts/k8s-tools.sh --check   exit 0 when all three are cached, 1 when
#                                         not (no lock taken, nothing built)
#
# Binaries are cached outside the repo, keyed by version:
#   ${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}/<name>-<version>/bin/<binary>
# and a combined directory of symlinks to all three is printed as the LAST line
# of stdout (all progress messages go to stderr). A second run only checks that
# the cached files exist, so it is instant.
#
# Nothing is downloaded except Go modules through the machine's default Go
# environment (GOPROXY etc. are left as configured). If a binary cannot be
# built the script exits non-zero with a message; it never substitutes a fake.
#
# Environment:
#   MEATSPACE_TOOLS_CACHE  cache root (default $HOME/.cache/meatspace-tools)
#   GO                     go command to use (default: `go` on PATH, else /usr/local/go/bin/go)
#   MEATSPACE_TOOLS_NICE   nice level for the builds (default 10)
set -euo pipefail

# ---- pinned versions --------------------------------------------------------
KUBERNETES_VERSION=v1.37.2   # k8s.io/kubernetes; staging modules are v0.<minor>.<patch>
ETCD_VERSION=v3.6.16         # go.etcd.io/etcd/server/v3
HELM_VERSION=v3.22.0         # helm.sh/helm/v3 (a v4.x version switches to helm.sh/helm/v4)
# ----------------------------------------------------------------------------

CACHE_ROOT=${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}
NICE_LEVEL=${MEATSPACE_TOOLS_NICE:-10}

log() { printf '[k8s-tools] %s\n' "$*" >&2; }
die() { printf '[k8s-tools] ERROR: %s\n' "$*" >&2; exit 1; }

find_go() {
  if [[ -n ${GO:-} ]]; then echo "$GO"; return; fi
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return; fi
  return 1
}

# Paths of the cached binaries.
apiserver_bin="$CACHE_ROOT/kube-apiserver-$KUBERNETES_VERSION/bin/kube-apiserver"
etcd_bin="$CACHE_ROOT/etcd-$ETCD_VERSION/bin/etcd"
helm_bin="$CACHE_ROOT/helm-$HELM_VERSION/bin/helm"
combined_dir="$CACHE_ROOT/toolset-k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION/bin"

# Fast path: everything is already there.
link_combined() {
  mkdir -p "$combined_dir"
  ln -sfn "$apiserver_bin" "$combined_dir/kube-apiserver"
  ln -sfn "$etcd_bin" "$combined_dir/etcd"
  ln -sfn "$helm_bin" "$combined_dir/helm"
}
cached() { [[ -x $apiserver_bin && -x $etcd_bin && -x $helm_bin ]]; }
if [[ ${1:-} == --check ]]; then
  cached
  exit
fi
if cached; then
  [[ -L $combined_dir/kube-apiserver && -L $combined_dir/etcd && -L $combined_dir/helm ]] || link_combined
  echo "$combined_dir"
  exit 0
fi

GO_CMD=$(find_go) || die "no Go toolchain found (set GO=/path/to/go)"
log "using $GO_CMD ($("$GO_CMD" version))"

# Static, reproducible-ish builds; modules resolved from go.mod files we write.
export CGO_ENABLED=0
# -dwarf=false: the binaries are linked with -w (no DWARF) anyway, and the
# compiler would otherwise still generate it for every package.
export GOFLAGS="-mod=mod -buildvcs=false -gcflags=all=-dwarf=false"

mkdir -p "$CACHE_ROOT"
# Serialise concurrent builders (parallel test jobs may all call this script).
exec 9>"$CACHE_ROOT/.build.lock"
flock 9

WORK_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-tools.XXXXXX")
trap 'rm -rf "$WORK_ROOT"' EXIT

gobuild() { nice -n "$NICE_LEVEL" "$GO_CMD" "$@"; }

# new_wrapper NAME — creates and prints an empty directory for a wrapper module.
new_wrapper() {
  local dir="$WORK_ROOT/$1"
  mkdir -p "$dir"
  echo "$dir"
}

# finish_build TMP_OUT FINAL — atomically move a built binary into the cache.
finish_build() {
  local tmp=$1 final=$2
  [[ -x $tmp ]] || die "build produced no binary at $tmp"
  mkdir -p "$(dirname "$final")"
  mv -f "$tmp" "$final"
  log "cached $final"
}

# ---- kube-apiserver ---------------------------------------------------------
# k8s.io/kubernetes replaces every staging module (k8s.io/api, k8s.io/client-go,
# ...) with ./staging/src/... paths, which `go install pkg@version` refuses.
# So we build from a wrapper module that requires k8s.io/kubernetes and maps
# each staging module to its published v0.<minor>.<patch> release.
build_kube_apiserver() {
  local ver=$KUBERNETES_VERSION
  local staging_ver="v0.${ver#v1.}"
  local minor=${ver#v1.}; minor=${minor%%.*}
  local dir; dir=$(new_wrapper kube-apiserver)
  local start=$SECONDS
  log "building kube-apiserver $ver (staging modules at $staging_ver)"

  (
    cd "$dir"
    "$GO_CMD" mod init meatspace.local/tools/kube-apiserver 2>/dev/null
    "$GO_CMD" mod download -json "k8s.io/kubernetes@$ver" >"$dir/dl.json" \
      || die "go mod download k8s.io/kubernetes@$ver failed"
    local kmod
    kmod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' "$dir/dl.json" | head -1)
    [[ -f $kmod ]] || die "could not locate go.mod of k8s.io/kubernetes@$ver"

    # Every "k8s.io/X => ./staging/src/k8s.io/X" line becomes "k8s.io/X => k8s.io/X <staging_ver>".
    local staging
    staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$kmod")
    [[ -n $staging ]] || die "no staging replace directives found in $kmod"
    {
      echo
      echo "require k8s.io/kubernetes $ver"
      echo
      echo "replace ("
      local m
      for m in $staging; do echo "	$m => $m $staging_ver"; done
      echo ")"
      echo
      echo "tool k8s.io/kubernetes/cmd/kube-apiserver"
      # Same default GODEBUG settings as upstream's own go.mod.
      sed -n 's/^godebug /godebug /p' "$kmod"
    } >>go.mod
    log "kube-apiserver wrapper: $(wc -w <<<"$staging") staging modules replaced"

    gobuild mod tidy || die "go mod tidy failed for kube-apiserver wrapper"
    # Version stamping as in upstream's hack/lib/version.sh.
    local ldflags="-s -w" kv pkg
    for kv in "gitVersion=$ver" gitMajor=1 "gitMinor=$minor" gitTreeState=clean \
              buildDate=1970-01-01T00:00:00Z; do
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.$kv"
      done
    done
    gobuild build -trimpath -ldflags="$ldflags" -o "$dir/kube-apiserver" \
      k8s.io/kubernetes/cmd/kube-apiserver || die "go build kube-apiserver failed"
  )
  finish_build "$dir/kube-apiserver" "$apiserver_bin"
  log "kube-apiserver built in $((SECONDS - start))s"
}

# ---- etcd -------------------------------------------------------------------
# The etcd server main package is the root of go.etcd.io/etcd/server/v3; its
# go.mod replaces sibling modules with ../ paths, so it also needs a wrapper
# (dependency replace directives are ignored there and the published
# go.etcd.io/etcd/{api,client,pkg} versions it requires are used).
build_etcd() {
  local ver=$ETCD_VERSION
  local dir; dir=$(new_wrapper etcd)
  local start=$SECONDS
  log "building etcd $ver"
  (
    cd "$dir"
    "$GO_CMD" mod init meatspace.local/tools/etcd 2>/dev/null
    cat >>go.mod <<EOF

require go.etcd.io/etcd/server/v3 $ver

tool go.etcd.io/etcd/server/v3
EOF
    gobuild mod tidy || die "go mod tidy failed for etcd wrapper"
    gobuild build -trimpath -ldflags="-s -w" -o "$dir/etcd" go.etcd.io/etcd/server/v3 \
      || die "go build etcd failed"
  )
  finish_build "$dir/etcd" "$etcd_bin"
  log "etcd built in $((SECONDS - start))s"
}

# ---- helm -------------------------------------------------------------------
build_helm() {
  local ver=$HELM_VERSION
  local major=${ver%%.*}              # v3 or v4
  local mod="helm.sh/helm/$major"
  local dir; dir=$(new_wrapper helm)
  local start=$SECONDS
  log "building helm $ver ($mod)"
  (
    cd "$dir"
    "$GO_CMD" mod init meatspace.local/tools/helm 2>/dev/null
    cat >>go.mod <<EOF

require $mod $ver

tool $mod/cmd/helm
EOF
    gobuild mod tidy || die "go mod tidy failed for helm wrapper"
    # Same version stamping as helm's Makefile, including the Kubernetes
    # version helm assumes for `helm template` (from the client-go it uses).
    local cg kmaj=1 kmin
    cg=$("$GO_CMD" list -m -f '{{.Version}}' k8s.io/client-go) || die "cannot resolve k8s.io/client-go for helm"
    cg=${cg#v0.}; kmin=${cg%%.*}   # client-go v0.35.x => Kubernetes 1.35
    local ldflags="-s -w -X $mod/internal/version.version=$ver -X $mod/internal/version.gitTreeState=clean"
    if [[ $major == v3 ]]; then
      ldflags+=" -X $mod/pkg/lint/rules.k8sVersionMajor=$kmaj -X $mod/pkg/lint/rules.k8sVersionMinor=$kmin"
      ldflags+=" -X $mod/pkg/chartutil.k8sVersionMajor=$kmaj -X $mod/pkg/chartutil.k8sVersionMinor=$kmin"
    fi
    gobuild build -trimpath -ldflags="$ldflags" -o "$dir/helm" "$mod/cmd/helm" \
      || die "go build helm failed"
  )
  finish_build "$dir/helm" "$helm_bin"
  log "helm built in $((SECONDS - start))s"
}

# Re-check under the lock: another process may have built them meanwhile.
# The three are separate module graphs, built side by side: one build's
# single-threaded steps (module downloads, go mod tidy, the link) leave a
# core to the others.
builds=()
[[ -x $etcd_bin ]] || { build_etcd & builds+=("etcd:$!"); }
[[ -x $helm_bin ]] || { build_helm & builds+=("helm:$!"); }
[[ -x $apiserver_bin ]] || { build_kube_apiserver & builds+=("kube-apiserver:$!"); }
failed=()
for b in "${builds[@]}"; do wait "${b#*:}" || failed+=("${b%%:*}"); done
((${#failed[@]} == 0)) || die "building ${failed[*]} failed (messages above)"

# Sanity: each binary must run and report its version.
"$etcd_bin" --version >/dev/null || die "$etcd_bin does not run"
"$apiserver_bin" --version >/dev/null || die "$apiserver_bin does not run"
"$helm_bin" version --short >/dev/null || die "$helm_bin does not run"

link_combined
log "etcd: $("$etcd_bin" --version | head -1); kube-apiserver: $("$apiserver_bin" --version); helm: $("$helm_bin" version --short)"
echo "$combined_dir"
