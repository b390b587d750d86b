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

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=go-tools.sh
source "$SCRIPT_DIR/go-tools.sh"

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

go_setup .build.lock meatspace-tools

# ---- kube-apiserver ---------------------------------------------------------
build_kube_apiserver() (
  enter_module kube-apiserver
  log "building kube-apiserver $KUBERNETES_VERSION"
  require_kubernetes kube-apiserver
  gobuild build -trimpath -ldflags="$(kubernetes_ldflags)" -o out/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-apiserver || die "go build kube-apiserver failed"
  cache_binaries "$(dirname "$apiserver_bin")" kube-apiserver
)

# ---- etcd -------------------------------------------------------------------
# The etcd server main package is the root of go.etcd.io/etcd/server/v3; its
# go.mod replaces sibling modules with ../ paths, so it also needs a wrapper
# (dependency replace directives are ignored there and the published
# go.etcd.io/etcd/{api,client,pkg} versions it requires are used).
build_etcd() (
  local ver=$ETCD_VERSION
  enter_module etcd
  log "building etcd $ver"
  require_tools go.etcd.io/etcd/server/v3 "$ver" go.etcd.io/etcd/server/v3
  gobuild build -trimpath -ldflags="-s -w" -o out/etcd go.etcd.io/etcd/server/v3 \
    || die "go build etcd failed"
  cache_binaries "$(dirname "$etcd_bin")" etcd
)

# ---- helm -------------------------------------------------------------------
build_helm() (
  local ver=$HELM_VERSION
  local major=${ver%%.*}              # v3 or v4
  local mod="helm.sh/helm/$major"
  enter_module helm
  log "building helm $ver ($mod)"
  require_tools "$mod" "$ver" "$mod/cmd/helm"
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
  gobuild build -trimpath -ldflags="$ldflags" -o out/helm "$mod/cmd/helm" \
    || die "go build helm failed"
  cache_binaries "$(dirname "$helm_bin")" helm
)

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
