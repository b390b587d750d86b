#!/usr/bin/env bash
# cluster.sh — a throwaway one-node Kubernetes cluster on this machine, for
# running meatspace's chart for real: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, containerd 2 (runc), kubelet, kube-proxy
# (iptables) and CoreDNS, with a CNI bridge of its own. Needs root.
#
# Usage:
#   cluster.sh start DIR     start everything with its state in DIR, wait for the node
#                            to be Ready; writes DIR/admin.kubeconfig and DIR/env and
#                            prints DIR/env as the last line of stdout
#   cluster.sh import DIR FILE.tar...
#                            load docker-archive images into the node's containerd
#   cluster.sh stop DIR      stop everything, remove the pods' containers, mounts,
#                            iptables rules, the bridge, and DIR
#
# Network: pods get addresses on the bridge msp0 (10.244.77.0/24, the node
# itself is 10.244.77.1), Services come from 10.96.77.0/24. Forwarding from the
# bridge to any other interface is dropped: pods reach only each other, the
# node and the apiserver, which listens on the node's bridge address and
# 127.0.0.1. CoreDNS runs on the node (10.244.77.1:53) as the cluster DNS,
# answering cluster.local only. Images are never pulled: whatever pods use
# must be imported first (`cluster.sh import`), the pause image included
# (image.sh support builds it).
#
# Interruption: a failed or interrupted start stops what it started. `stop`
# may be run any number of times; it cleans up whatever is left.
#
# Environment:
#   MEATSPACE_NODE_BIN    directory with all binaries (default: output of node-tools.sh)
#   MEATSPACE_PAUSE_IMAGE the sandbox image (default docker.io/meatspace-test/pause:3.10)
#   RUNC                  runc binary (default: the one node-tools.sh builds)
set -euo pipefail

LOG_PREFIX=cluster
# shellcheck source=service-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MARKER=.meatspace-cluster
BRIDGE=msp0
POD_CIDR=10.244.77.0/24
NODE_IP=10.244.77.1
SERVICE_CIDR=10.96.77.0/24
SERVICE_IP=10.96.77.1
NODE_NAME=meatspace-node
PAUSE_IMAGE=${MEATSPACE_PAUSE_IMAGE:-docker.io/meatspace-test/pause:3.10}
FW_CHAIN=MEATSPACE-CLUSTER
READY_TIMEOUT=180


pid_alive() {
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/stat ]] || return 1
  [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

stop_process() {
  local pidfile=$1 name=$2 pid
  pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do
    pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    sleep 0.1
  done
  log "$name (pid $pid) did not stop after 15s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do pid_alive "$pidfile" || break; sleep 0.1; done
  rm -f "$pidfile"
}

# start_detached NAME CMD... — run CMD in its own session, log in DIR/logs/NAME.log.
start_detached() {
  local name=$1; shift
  local pidfile=$DIR/$name.pid
  # shellcheck disable=SC2016 # expanded by the inner bash
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" \
    </dev/null >>"$DIR/logs/$name.log" 2>&1 &
  for _ in $(seq 1 100); do
    [[ -s $pidfile ]] && pid_alive "$pidfile" && return 0
    sleep 0.1
  done
  die "$name did not start (see $DIR/logs/$name.log)"
}

# wait_for WHAT SECONDS PROCESS-NAME COMMAND... — until COMMAND succeeds;
# fails early when PROCESS-NAME died.
wait_for() {
  local what=$1 timeout=$2 name=$3; shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [[ -n $name ]] && ! pid_alive "$DIR/$name.pid"; then
      tail -n 40 "$DIR/logs/$name.log" >&2 || true
      die "$name exited while waiting for $what"
    fi
    if ((SECONDS >= deadline)); then
      [[ -z $name ]] || tail -n 40 "$DIR/logs/$name.log" >&2 || true
      die "timed out after ${timeout}s waiting for $what"
    fi
    sleep 0.3
  done
}

# ---- certificates -----------------------------------------------------------
gen_certs() {
  local d=$DIR/pki
  mkdir -p "$d"
  (
    cd "$d"
    umask 077
    make_ca meatspace-cluster-ca 30
    sign() {  # NAME SUBJECT EXTENDED-KEY-USAGE [SAN]
      sign_cert "$1" "$2" 30 "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$3${4:+
subjectAltName=$4}"
    }
    sign apiserver /CN=kube-apiserver serverAuth \
      "IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    sign admin /O=system:masters/CN=meatspace-admin clientAuth
    sign kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" serverAuth,clientAuth "IP:$NODE_IP,DNS:$NODE_NAME"
    sign apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client clientAuth
    sign kube-proxy /CN=system:kube-proxy clientAuth
    sign kube-scheduler /CN=system:kube-scheduler clientAuth
    sign kube-controller-manager /CN=system:kube-controller-manager clientAuth
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

b64() { base64 -w0 <"$1"; }
kubeconfig() {  # NAME URL — DIR/NAME.kubeconfig from pki/NAME.{crt,key}
  local name=$1 url=$2
  # Only this file is private: the cluster's processes inherit the umask.
  (umask 077; cat >"$DIR/$name.kubeconfig") <<EOF
apiVersion: v1
kind: Config
clusters:
- name: meatspace-cluster
  cluster:
    server: $url
    certificate-authority-data: $(b64 "$DIR/pki/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(b64 "$DIR/pki/$name.crt")
    client-key-data: $(b64 "$DIR/pki/$name.key")
contexts:
- name: $name
  context: {cluster: meatspace-cluster, user: $name}
current-context: $name
EOF
}

free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$(( 10000 + (RANDOM * 32768 + RANDOM) % 22000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && [[ " ${USED_PORTS:-} " != *" $port "* ]]; then
      USED_PORTS="${USED_PORTS:-} $port"; echo "$port"; return 0
    fi
  done
  die "no free port on 127.0.0.1"
}

# ---- network ----------------------------------------------------------------
setup_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # The Service range is routed to the bridge too: a packet to a ClusterIP
  # that no kube-proxy rule rewrote (yet) stays on this machine.
  ip route replace "$SERVICE_CIDR" dev "$BRIDGE"
  # Forwarding on, remembered so that stop restores it.
  [[ -f $DIR/ip_forward.orig ]] || cat /proc/sys/net/ipv4/ip_forward >"$DIR/ip_forward.orig"
  echo 1 >/proc/sys/net/ipv4/ip_forward
  # Bridged pod-to-pod traffic through iptables (kube-proxy's Service rules).
  if [[ -w /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
    [[ -f $DIR/bridge-nf.orig ]] || cat /proc/sys/net/bridge/bridge-nf-call-iptables >"$DIR/bridge-nf.orig"
    echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  fi
  # Nothing from the pods leaves through another interface.
  iptables -N "$FW_CHAIN" 2>/dev/null || iptables -F "$FW_CHAIN"
  iptables -A "$FW_CHAIN" -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
  iptables -A "$FW_CHAIN" -i "$BRIDGE" -j DROP
  iptables -A "$FW_CHAIN" -o "$BRIDGE" ! -i "$BRIDGE" -j DROP
  iptables -C FORWARD -j "$FW_CHAIN" 2>/dev/null || iptables -I FORWARD 1 -j "$FW_CHAIN"

  mkdir -p "$DIR/cni/net.d"
  cat >"$DIR/cni/net.d/10-meatspace.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "meatspace",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$DIR/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

teardown_network() {
  if iptables -C FORWARD -j "$FW_CHAIN" 2>/dev/null; then iptables -D FORWARD -j "$FW_CHAIN"; fi
  iptables -F "$FW_CHAIN" 2>/dev/null && iptables -X "$FW_CHAIN" 2>/dev/null || true
  # The chains of the CNI plugins (CNI-*), of kube-proxy and of the kubelet
  # (KUBE-*, e.g. KUBE-FIREWALL, which kube-proxy --cleanup leaves): first
  # every rule that jumps to one, then the chains.
  local ipt t c
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      local chains
      chains=$("$ipt" -t "$t" -S 2>/dev/null | awk '/^-N (CNI-|KUBE-)/{print $2}')
      [[ -n $chains ]] || continue
      { "$ipt" -t "$t" -S 2>/dev/null | grep -E -- '-j (CNI-|KUBE-)' || true; } | sed 's/^-A/-D/' | while read -r rule; do
        # shellcheck disable=SC2086 # a rule as iptables -S prints it
        eval "$ipt -t $t $rule" 2>/dev/null || true
      done
      for c in $chains; do "$ipt" -t "$t" -F "$c" 2>/dev/null || true; done
      for c in $chains; do "$ipt" -t "$t" -X "$c" 2>/dev/null || true; done
    done
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE"; fi
  local veth
  for veth in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link delete "$veth" 2>/dev/null || true
  done
  [[ -f $DIR/ip_forward.orig ]] && cat "$DIR/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward || true
  [[ -f $DIR/bridge-nf.orig ]] && cat "$DIR/bridge-nf.orig" >/proc/sys/net/bridge/bridge-nf-call-iptables || true
}

# ---- start --------------------------------------------------------------------
STARTED=false
on_start_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $rc -ne 0 ]] && ! $STARTED; then
    log "start failed (exit $rc); stopping what was started (logs kept in ${DIR:-?}.logs)"
    [[ -d ${DIR:-} ]] && cp -a "$DIR/logs" "$DIR.logs" 2>/dev/null || true
    cmd_stop "$DIR" || true
  fi
  exit "$rc"
}

cmd_start() {
  [[ $# -eq 1 ]] || usage
  [[ $(id -u) == 0 ]] || die "needs root (containerd, kubelet, iptables, the bridge)"
  DIR=$(abspath "$1")
  [[ ! -f $DIR/$MARKER ]] || die "$DIR already holds a cluster (cluster.sh stop $DIR first)"
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "the bridge $BRIDGE exists: another cluster.sh cluster runs (or a stale one: ip link delete $BRIDGE)"
  fi
  touch "$DIR/$MARKER"
  trap on_start_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p "$DIR/logs"

  local bin=${MEATSPACE_NODE_BIN:-}
  [[ -n $bin ]] || bin=$("$SCRIPT_DIR/node-tools.sh" | tail -n 1) || die "node-tools.sh failed"
  local b
  for b in etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy coredns containerd containerd-shim-runc-v2 ctr runc; do
    [[ -x $bin/$b ]] || die "$b not found in $bin"
  done
  local runc=${RUNC:-$bin/runc}
  [[ -x $runc ]] || die "no runc at $runc"
  local t
  for t in iptables ip conntrack openssl curl; do command -v "$t" >/dev/null || die "$t is not installed"; done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback && -x /usr/lib/cni/portmap ]] \
    || die "CNI plugins missing in /usr/lib/cni (apt-get install containernetworking-plugins)"
  printf '%s\n' "$bin" >"$DIR/bin"
  # containerd starts its shim by name from PATH: ours, not a distribution's.
  export PATH=$bin:$PATH

  local t0=$SECONDS
  gen_certs
  setup_network

  # etcd
  local etcd_port etcd_peer api_port
  etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)
  start_detached etcd "$bin/etcd" --name=meatspace --data-dir="$DIR/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
    --initial-cluster="meatspace=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync=true --log-level=warn
  wait_for "etcd" 60 etcd curl -fsS "http://127.0.0.1:$etcd_port/health"

  # kube-apiserver: on the node's bridge address (pods reach it through the
  # `kubernetes` Service), and kubectl on the host uses the same address.
  local api_url="https://$NODE_IP:$api_port"
  start_detached kube-apiserver "$bin/kube-apiserver" \
    --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port="$api_port" \
    --cert-dir="$DIR/pki/generated" \
    --tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
    --client-ca-file="$DIR/pki/ca.crt" \
    --kubelet-client-certificate="$DIR/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$DIR/pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --authorization-mode=Node,RBAC \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --service-account-issuer="https://kubernetes.default.svc" \
    --service-account-key-file="$DIR/pki/sa.pub" \
    --service-account-signing-key-file="$DIR/pki/sa.key" \
    --allow-privileged=true --profiling=false --v=1
  for b in admin kubelet kube-proxy kube-scheduler kube-controller-manager; do kubeconfig "$b" "$api_url"; done
  local kadm=(kubectl --kubeconfig "$DIR/admin.kubeconfig")
  wait_for "kube-apiserver /readyz" 90 kube-apiserver "${kadm[@]}" get --raw /readyz

  start_detached kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false \
    --service-account-private-key-file="$DIR/pki/sa.key" --root-ca-file="$DIR/pki/ca.crt" \
    --use-service-account-credentials=true \
    --service-cluster-ip-range="$SERVICE_CIDR" --v=1
  start_detached kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false --v=1

  # containerd 2 (CRI), runc, the CNI bridge; cgroupfs (no systemd here).
  mkdir -p "$DIR/containerd"
  cat >"$DIR/containerd/config.toml" <<EOF
version = 3
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$DIR/containerd/containerd.sock"
[ttrpc]
  address = "$DIR/containerd/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins.'io.containerd.cri.v1.images']
  # Not overlayfs: on this kernel a non-root process in a container cannot
  # open the files of an overlay's lower layers (EACCES), so every pod that
  # runs as non-root fails to load its libraries. native copies each layer.
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # Root here lacks CAP_SYS_RESOURCE: no process may lower its OOM score
  # (the sandbox's -998 is refused), so scores stay at or above containerd's.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$DIR/cni/net.d"
EOF
  start_detached containerd "$bin/containerd" --config "$DIR/containerd/config.toml"
  local ctr=("$bin/ctr" --address "$DIR/containerd/containerd.sock")
  wait_for "containerd" 60 containerd "${ctr[@]}" version

  # CoreDNS on the node: the cluster DNS at NODE_IP:53, cluster.local only.
  cat >"$DIR/Corefile" <<EOF
cluster.local:53 {
  bind $NODE_IP
  errors
  kubernetes cluster.local {
    kubeconfig $DIR/admin.kubeconfig admin
    pods insecure
  }
  cache 5
}
.:53 {
  bind $NODE_IP
  errors
  template ANY ANY {
    rcode NXDOMAIN
  }
}
EOF
  start_detached coredns "$bin/coredns" -conf "$DIR/Corefile"

  # kubelet 1.37 on cgroup v1 (failCgroupV1: false); images are imported,
  # never pulled; eviction thresholds low enough not to evict on a full disk.
  mkdir -p "$DIR/kubelet"
  printf 'nameserver %s\n' "$NODE_IP" >"$DIR/resolv.conf"
  cat >"$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $DIR/pki/kubelet.crt
tlsPrivateKeyFile: $DIR/pki/kubelet.key
clusterDomain: cluster.local
clusterDNS: [$NODE_IP]
resolvConf: $DIR/resolv.conf
failSwapOn: false
oomScoreAdj: 0
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
podPidsLimit: 4096
maxPods: 30
EOF
  start_detached kubelet "$bin/kubelet" --config="$DIR/kubelet/config.yaml" \
    --kubeconfig="$DIR/kubelet.kubeconfig" --root-dir="$DIR/kubelet/root" \
    --cert-dir="$DIR/kubelet/pki" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1

  # kube-proxy (iptables). No conntrack sysctl tuning: leave the host's as it is.
  cat >"$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $DIR/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
oomScoreAdj: 0
EOF
  start_detached kube-proxy "$bin/kube-proxy" --config="$DIR/kube-proxy.yaml" --v=1

  wait_for "node $NODE_NAME Ready" "$READY_TIMEOUT" kubelet \
    "${kadm[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
  wait_for "the default ServiceAccount" 60 kube-controller-manager "${kadm[@]}" -n default get serviceaccount default

  write_env "$DIR/env" "meatspace one-node cluster in $DIR" \
    "KUBECONFIG=$DIR/admin.kubeconfig" "MEATSPACE_TEST_KUBECONFIG=$DIR/admin.kubeconfig" \
    "MEATSPACE_CLUSTER_DIR=$DIR" "MEATSPACE_APISERVER_URL=$api_url" "MEATSPACE_NODE_BIN=$bin" \
    "MEATSPACE_NODE_IP=$NODE_IP" "CONTAINERD_ADDRESS=$DIR/containerd/containerd.sock"
  STARTED=true
  log "one-node cluster ready in $((SECONDS - t0))s: $api_url (source $DIR/env)"
  echo "$DIR/env"
}

cmd_import() {
  [[ $# -ge 2 ]] || usage
  local dir=$1; shift
  [[ -f $dir/$MARKER && -S $dir/containerd/containerd.sock ]] || die "no running cluster in $dir"
  local bin f
  bin=$(<"$dir/bin")
  for f in "$@"; do
    "$bin/ctr" --address "$dir/containerd/containerd.sock" -n k8s.io images import --no-unpack "$f" >/dev/null \
      || die "ctr images import $f failed"
    log "imported $f"
  done
}

cmd_stop() {
  [[ $# -eq 1 ]] || usage
  DIR=$1
  [[ -d $DIR ]] || { log "$DIR does not exist; nothing to stop"; return 0; }
  [[ -f $DIR/$MARKER ]] || die "$DIR was not created by $0 start; refusing to touch it"
  DIR=$(cd "$DIR" && pwd)
  local bin=""; [[ -f $DIR/bin ]] && bin=$(<"$DIR/bin")
  # The kubelet first, so that it restarts nothing; then every pod's containers
  # and sandbox through containerd (CNI DEL releases their addresses).
  stop_process "$DIR/kubelet.pid" kubelet
  if [[ -n $bin && -S $DIR/containerd/containerd.sock ]] && pid_alive "$DIR/containerd.pid"; then
    local c=("$bin/ctr" --address "$DIR/containerd/containerd.sock" -n k8s.io) id
    for id in $("${c[@]}" tasks ls -q 2>/dev/null); do
      "${c[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for _ in $(seq 1 50); do
      [[ -z $("${c[@]}" tasks ls -q 2>/dev/null | head -1) ]] && break
      sleep 0.2
    done
    for id in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $("${c[@]}" containers ls -q 2>/dev/null); do "${c[@]}" containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop_process "$DIR/kube-proxy.pid" kube-proxy
  [[ -n $bin && -x $bin/kube-proxy ]] && "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
  stop_process "$DIR/containerd.pid" containerd
  # Shims left behind (their parent is gone): only those of this DIR.
  local p
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $DIR/" 2>/dev/null || true); do kill -KILL "$p" 2>/dev/null || true; done
  stop_process "$DIR/coredns.pid" coredns
  stop_process "$DIR/kube-scheduler.pid" kube-scheduler
  stop_process "$DIR/kube-controller-manager.pid" kube-controller-manager
  stop_process "$DIR/kube-apiserver.pid" kube-apiserver
  stop_process "$DIR/etcd.pid" etcd
  # Every mount below DIR (pod volumes, rootfs, shm, netns), deepest first.
  local m
  for _ in 1 2 3; do
    for m in $(awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
  # Network namespaces of pods whose sandbox was not torn down by CNI.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$ns" 2>/dev/null || true; done
  teardown_network
  # Conntrack entries of the pod and Service ranges.
  conntrack -D -s "$POD_CIDR" >/dev/null 2>&1 || true
  conntrack -D -d "$SERVICE_CIDR" >/dev/null 2>&1 || true
  # Cgroups the kubelet created (kubepods) in every v1 hierarchy.
  local cg
  for cg in /sys/fs/cgroup/*/kubepods; do
    [[ -d $cg ]] || continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$DIR"
  log "stopped and removed $DIR"
}

run_subcommand "$@"
