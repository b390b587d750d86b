#!/usr/bin/env bash
# node-tools.sh — build (from Go module sources) and cache the binaries of a
# one-node Kubernetes cluster beyond what scripts/k8s-tools.sh builds for the
# control plane: kubelet, kube-proxy, kube-scheduler, kube-controller-manager
# (all from the same k8s.io/kubernetes module as the apiserver), CoreDNS, and
# containerd 2.x with its runc shim and ctr (kubelet 1.36+ needs the CRI
# RuntimeConfig call of containerd 2; Debian 12's containerd is 1.6) and
# runc (Debian 12's runc 1.1.5 fails every pod sandbox containerd 2 asks
# for: "can't get final child's PID from pipe: EOF"; built with cgo against
# Debian's libseccomp-dev).
#
# Usage:   NODE_BIN=$(scripts/node-tools.sh | tail -1)
#          scripts/node-tools.sh --check   exit 0 when these and k8s-tools.sh's
#                                          binaries are cached, 1 when not
#
# Binaries are cached outside the repo, keyed by version:
#   ${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}/<name>-<version>/bin/<binary>
# and a combined directory of symlinks to all of them (and to etcd,
# kube-apiserver and helm from k8s-tools.sh) is printed as the LAST line of
# stdout; progress goes to stderr. A second run only checks the cache.
#
# Environment: as scripts/k8s-tools.sh (MEATSPACE_TOOLS_CACHE, GO, MEATSPACE_TOOLS_NICE).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=go-tools.sh
source "$SCRIPT_DIR/go-tools.sh"

# ---- pinned versions --------------------------------------------------------
# KUBERNETES_VERSION is read from k8s-tools.sh: node and control plane agree.
KUBERNETES_VERSION=$(sed -n 's/^KUBERNETES_VERSION=\(v[0-9.]*\).*/\1/p' "$SCRIPT_DIR/k8s-tools.sh")
COREDNS_VERSION=v1.14.7        # github.com/coredns/coredns
CONTAINERD_VERSION=v2.2.9      # github.com/containerd/containerd/v2 (2.2: long-term support)
RUNC_VERSION=v1.4.4            # github.com/opencontainers/runc
# ----------------------------------------------------------------------------
[[ $KUBERNETES_VERSION == v1.* ]] || { echo "[node-tools] ERROR: no KUBERNETES_VERSION in k8s-tools.sh" >&2; exit 1; }

CACHE_ROOT=${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}
NICE_LEVEL=${MEATSPACE_TOOLS_NICE:-10}

log() { printf '[node-tools] %s\n' "$*" >&2; }
die() { printf '[node-tools] ERROR: %s\n' "$*" >&2; exit 1; }

K8S_NODE_BINS=(kubelet kube-proxy kube-scheduler kube-controller-manager)
CONTAINERD_BINS=(containerd containerd-shim-runc-v2 ctr)
k8s_dir="$CACHE_ROOT/kube-node-$KUBERNETES_VERSION/bin"
coredns_bin="$CACHE_ROOT/coredns-$COREDNS_VERSION/bin/coredns"
containerd_dir="$CACHE_ROOT/containerd-$CONTAINERD_VERSION/bin"
runc_bin="$CACHE_ROOT/runc-$RUNC_VERSION/bin/runc"
combined_dir="$CACHE_ROOT/toolset-node-k8s-$KUBERNETES_VERSION-coredns-$COREDNS_VERSION-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION/bin"

all_built() {
  local b
  for b in "${K8S_NODE_BINS[@]}"; do [[ -x $k8s_dir/$b ]] || return 1; done
  for b in "${CONTAINERD_BINS[@]}"; do [[ -x $containerd_dir/$b ]] || return 1; done
  [[ -x $coredns_bin && -x $runc_bin ]]
}

link_combined() {
  local cp_bin=$1 b
  mkdir -p "$combined_dir"
  for b in "${K8S_NODE_BINS[@]}"; do ln -sfn "$k8s_dir/$b" "$combined_dir/$b"; done
  for b in "${CONTAINERD_BINS[@]}"; do ln -sfn "$containerd_dir/$b" "$combined_dir/$b"; done
  ln -sfn "$coredns_bin" "$combined_dir/coredns"
  ln -sfn "$runc_bin" "$combined_dir/runc"
  for b in etcd kube-apiserver helm; do ln -sfn "$(readlink -f "$cp_bin/$b")" "$combined_dir/$b"; done
}

if [[ ${1:-} == --check ]]; then
  all_built && "$SCRIPT_DIR/k8s-tools.sh" --check
  exit
fi

# The control-plane binaries first (their own cache and lock).
CP_BIN=$("$SCRIPT_DIR/k8s-tools.sh" | tail -n 1) || die "k8s-tools.sh failed"

if all_built; then
  [[ -L $combined_dir/kubelet && -L $combined_dir/coredns && -L $combined_dir/helm ]] || link_combined "$CP_BIN"
  echo "$combined_dir"
  exit 0
fi

go_setup .build-node.lock meatspace-node-tools

# ---- kubelet, kube-proxy, kube-scheduler, kube-controller-manager ------------
# The same wrapper module as k8s-tools.sh's kube-apiserver.
build_k8s_node() (
  local pkgs=() b
  enter_module kube-node
  log "building ${K8S_NODE_BINS[*]} $KUBERNETES_VERSION"
  require_kubernetes "${K8S_NODE_BINS[@]}"
  for b in "${K8S_NODE_BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  gobuild build -trimpath -ldflags="$(kubernetes_ldflags)" -o out/ "${pkgs[@]}" \
    || die "go build ${K8S_NODE_BINS[*]} failed"
  cache_binaries "$k8s_dir" "${K8S_NODE_BINS[@]}"
)

# ---- CoreDNS -------------------------------------------------------------------
build_coredns() (
  local ver=$COREDNS_VERSION
  enter_module coredns
  log "building coredns $ver"
  require_tools github.com/coredns/coredns "$ver" github.com/coredns/coredns
  gobuild build -trimpath -ldflags="-s -w" -o out/coredns github.com/coredns/coredns \
    || die "go build coredns failed"
  cache_binaries "$(dirname "$coredns_bin")" coredns
)

# ---- containerd 2 ----------------------------------------------------------------
# Static, without the btrfs/devmapper/zfs snapshotters (overlayfs and native
# are what the node uses).
build_containerd() (
  local ver=$CONTAINERD_VERSION pkgs=() b
  local mod=github.com/containerd/containerd/v2
  enter_module containerd
  log "building ${CONTAINERD_BINS[*]} $ver"
  for b in "${CONTAINERD_BINS[@]}"; do pkgs+=("$mod/cmd/$b"); done
  require_tools "$mod" "$ver" "${pkgs[@]}"
  gobuild build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags="-s -w -X $mod/version.Version=$ver -X $mod/version.Package=$mod" \
    -o out/ "${pkgs[@]}" || die "go build containerd failed"
  cache_binaries "$containerd_dir" "${CONTAINERD_BINS[@]}"
)

# ---- runc ---------------------------------------------------------------------------
build_runc() (
  local ver=$RUNC_VERSION
  [[ -f /usr/include/seccomp.h ]] || die "runc needs libseccomp's headers (apt-get install libseccomp-dev)"
  enter_module runc
  log "building runc $ver"
  require_tools github.com/opencontainers/runc "$ver" github.com/opencontainers/runc
  CGO_ENABLED=1 gobuild build -trimpath -tags seccomp -ldflags="-s -w -X main.version=${ver#v}" \
    -o out/runc github.com/opencontainers/runc || die "go build runc failed"
  cache_binaries "$(dirname "$runc_bin")" runc
)

# Separate module graphs, built side by side as in k8s-tools.sh; the
# Kubernetes binaries share most of their packages with kube-apiserver's
# build (Go's build cache).
builds=()
[[ -x $runc_bin ]] || { build_runc & builds+=("runc:$!"); }
[[ -x $containerd_dir/containerd && -x $containerd_dir/ctr && -x $containerd_dir/containerd-shim-runc-v2 ]] \
  || { build_containerd & builds+=("containerd:$!"); }
[[ -x $coredns_bin ]] || { build_coredns & builds+=("coredns:$!"); }
k8s_node_built() { local b; for b in "${K8S_NODE_BINS[@]}"; do [[ -x $k8s_dir/$b ]] || return 1; done; }
k8s_node_built || { build_k8s_node & builds+=("kube-node:$!"); }
failed=()
for b in "${builds[@]}"; do wait "${b#*:}" || failed+=("${b%%:*}"); done
((${#failed[@]} == 0)) || die "building ${failed[*]} failed (messages above)"

"$k8s_dir/kubelet" --version >/dev/null || die "kubelet does not run"
"$containerd_dir/containerd" --version >/dev/null || die "containerd does not run"
"$coredns_bin" -version >/dev/null || die "coredns does not run"
"$runc_bin" --version >/dev/null || die "runc does not run"
link_combined "$CP_BIN"
log "$("$k8s_dir/kubelet" --version); $("$containerd_dir/containerd" --version); $("$coredns_bin" -version | head -1)"
echo "$combined_dir"
