#!/usr/bin/env bash
# tools.sh — the Kubernetes tools (scripts/k8s-tools.sh, then
# scripts/node-tools.sh) built in the background while the Rust builds run,
# so that a new machine's first test run overlaps the two instead of adding
# them up. A run with the tools cached starts nothing.
#
# Usage:
#   tools.sh start DIR               start the build (unless every tool is
#                                    cached); its output goes to DIR/log, its
#                                    exit status to DIR/rc when it ends
#   tools.sh wait DIR control-plane  wait until etcd, kube-apiserver and helm
#   tools.sh wait DIR node           ... and the node's binaries are cached;
#                                    prints what the build logged; exits 1 if
#                                    the build ended without them
#   tools.sh stop DIR                stop a build still running (its process
#                                    group), e.g. when the test run fails early
#
# The builds run at MEATSPACE_TOOLS_NICE (default 10, as the tool scripts),
# so the test run's own steps come first on a busy machine.
set -euo pipefail

SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { printf '[tools] %s\n' "$*" >&2; }
die() { printf '[tools] ERROR: %s\n' "$*" >&2; exit 1; }

cmd=${1:-}
dir=${2:-}
[[ -n $cmd && -n $dir ]] || die "usage: tools.sh start|wait|stop DIR [control-plane|node]"

case $cmd in
  start)
    mkdir -p "$dir"
    rm -f "$dir/rc" "$dir/pid" "$dir/log"
    if "$SCRIPTS/node-tools.sh" --check; then
      echo 0 >"$dir/rc"
      log "every Kubernetes tool is cached"
      exit 0
    fi
    # setsid: a process group of its own, so that stop ends the go builds too.
    setsid bash -c '
      start=$SECONDS
      "$1/node-tools.sh" >/dev/null 2>>"$2/log" </dev/null
      rc=$?
      printf "[tools] background build ended (exit %s) after %ss\n" "$rc" "$((SECONDS - start))" >>"$2/log"
      echo "$rc" >"$2/rc"
    ' tools-build "$SCRIPTS" "$dir" </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/pid"
    log "building the Kubernetes tools in the background (pid $!, log $dir/log)"
    ;;
  wait)
    what=${3:-}
    case $what in
      control-plane) check=("$SCRIPTS/k8s-tools.sh" --check); lines='^\[k8s-tools\]' ;;
      node) check=("$SCRIPTS/node-tools.sh" --check); lines='^\[(node-tools|tools)\]' ;;
      *) die "wait: control-plane or node, not '$what'" ;;
    esac
    start=$SECONDS
    until "${check[@]}"; do
      if [[ -f $dir/rc ]]; then
        # The build ended: one last look (it may have cached them just now).
        "${check[@]}" && break
        [[ -f $dir/log ]] && tail -n 60 "$dir/log" >&2
        die "the background build ended (exit $(cat "$dir/rc")) without the $what tools"
      fi
      [[ -f $dir/pid ]] || die "no build was started in $dir (tools.sh start $dir)"
      # The interval of a poll that ends with the build (it writes rc).
      sleep 2
    done
    # What the build said of these tools (the times of each build among it).
    [[ -f $dir/log ]] && grep -E "$lines" "$dir/log" >&2 || true
    log "$what tools cached (waited $((SECONDS - start))s)"
    ;;
  stop)
    if [[ -f $dir/pid && ! -f $dir/rc ]]; then
      pid=$(cat "$dir/pid")
      kill -TERM -- "-$pid" 2>/dev/null || true
      log "stopped the background build (pid $pid)"
    fi
    ;;
  *) die "unknown command '$cmd' (start, wait, stop)" ;;
esac
