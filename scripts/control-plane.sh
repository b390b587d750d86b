#!/usr/bin/env bash
# control-plane.sh — a throwaway Kubernetes control plane (etcd + kube-apiserver)
# on 127.0.0.1 for meatspace tests, in the spirit of controller-runtime's envtest.
# There is no scheduler, controller-manager or kubelet: objects are stored and
# served (with RBAC, admission, TokenRequest), but nothing reconciles them
# (e.g. pods never run, deleted namespaces stay Terminating, no default SA).
#
# Usage:
#   control-plane.sh start DIR      generate certs in DIR, start etcd and kube-apiserver,
#                                   wait for /readyz, write DIR/admin.kubeconfig and DIR/env;
#                                   prints DIR/env as the last line of stdout
#   control-plane.sh env DIR        print DIR/env (use: eval "$(control-plane.sh env DIR)")
#   control-plane.sh sa-kubeconfig KUBECONFIG NAMESPACE SA OUT [DURATION]
#                                   write a kubeconfig at OUT for the cluster of the admin
#                                   KUBECONFIG (e.g. DIR/admin.kubeconfig; its CA inline)
#                                   that authenticates as the ServiceAccount NAMESPACE/SA
#                                   with a token from `kubectl create token` (default
#                                   duration 24h)
#   control-plane.sh stop DIR       stop the processes and remove DIR
#
# Environment:
#   MEATSPACE_K8S_BIN           directory with etcd and kube-apiserver (default: output of k8s-tools.sh)
#   MEATSPACE_CP_READY_TIMEOUT  seconds to wait for /readyz (default 120)
#   KUBECTL                     kubectl binary (default: kubectl on PATH)
set -euo pipefail

LOG_PREFIX=control-plane
# shellcheck source=service-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MARKER=.meatspace-control-plane
READY_TIMEOUT=${MEATSPACE_CP_READY_TIMEOUT:-120}
SERVICE_CIDR=10.0.0.0/24
SERVICE_IP=10.0.0.1   # first IP of SERVICE_CIDR: the `kubernetes` Service



# A TCP port on 127.0.0.1 that nothing is listening on (random, then re-checked).
free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$(( 10000 + (RANDOM * 32768 + RANDOM) % 22000 ))  # below the ephemeral range
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      # Not taken by one of our own earlier picks in this run either.
      if [[ " ${USED_PORTS:-} " != *" $port "* ]]; then
        USED_PORTS="${USED_PORTS:-} $port"
        echo "$port"
        return 0
      fi
    fi
  done
  die "could not find a free port on 127.0.0.1"
}

# pid_alive PIDFILE EXPECTED_BINARY_NAME — true if the recorded process still runs
# and is the expected program (guards against PID reuse).
pid_alive() {
  local pidfile=$1 name=$2 pid
  [[ -f $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/cmdline ]] || return 1
  local argv0; argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1)
  [[ ${argv0##*/} == "$name" ]] || return 1
  # A zombie is not alive.
  [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

stop_process() {
  local pidfile=$1 name=$2 pid
  pid_alive "$pidfile" "$name" || { rm -f "$pidfile"; return 0; }
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    pid_alive "$pidfile" "$name" || { rm -f "$pidfile"; return 0; }
    sleep 0.1
  done
  log "$name (pid $pid) did not stop after 10s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do pid_alive "$pidfile" "$name" || break; sleep 0.1; done
  rm -f "$pidfile"
}

# start_detached PIDFILE LOGFILE CMD... — run CMD in its own session, detached
# from our stdin/stdout/stderr, recording its PID (the exec'd program's PID).
start_detached() {
  local pidfile=$1 logfile=$2; shift 2
  # shellcheck disable=SC2016 # $$/$0/$@ are expanded by the inner bash
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" \
    </dev/null >>"$logfile" 2>&1 &
  # Wait until the PID file is written and the program has been exec'd.
  local name=${1##*/}
  for _ in $(seq 1 100); do
    [[ -s $pidfile ]] && pid_alive "$pidfile" "$name" && return 0
    sleep 0.1
  done
  die "process did not start: $* (see $logfile)"
}

# ---- certificates -----------------------------------------------------------
gen_certs() {
  local d=$1/pki
  mkdir -p "$d"
  (
    cd "$d"
    umask 077
    make_ca meatspace-test-ca 3650
    sign_cert apiserver "/CN=kube-apiserver" 3650 "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    sign_cert admin "/O=system:masters/CN=meatspace-admin" 3650 "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

    # Service-account token signing key pair (TokenRequest / `kubectl create token`).
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  [[ -s $d/ca.crt && -s $d/apiserver.crt && -s $d/admin.crt && -s $d/sa.pub ]] \
    || die "certificate generation failed in $d"
}

b64() { base64 -w0 <"$1"; }

# write_kubeconfig OUT SERVER CA_DATA USER NAMESPACE CREDENTIAL... — a kubeconfig
# (mode 0600) with one context: USER at SERVER (whose CA is CA_DATA, base64)
# in NAMESPACE, authenticated by the CREDENTIAL lines (`token: …`,
# `client-key-data: …`).
write_kubeconfig() {
  local out=$1 server=$2 ca=$3 user=$4 ns=$5 cred
  shift 5
  mkdir -p "$(dirname "$out")"
  (
    umask 077
    cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: meatspace-test
  cluster:
    server: $server
    certificate-authority-data: $ca
contexts:
- name: $user
  context:
    cluster: meatspace-test
    user: $user
    namespace: $ns
current-context: $user
users:
- name: $user
  user:
EOF
    for cred in "$@"; do echo "    $cred"; done >>"$out"
  )
}

dump_logs() {
  local dir=$1 f
  for f in "$dir/etcd.log" "$dir/kube-apiserver.log"; do
    [[ -f $f ]] || continue
    printf '\n===== last 60 lines of %s =====\n' "$f" >&2
    tail -n 60 "$f" >&2
  done
}

cmd_start() {
  [[ $# -eq 1 ]] || usage
  local dir; dir=$(abspath "$1")
  if pid_alive "$dir/kube-apiserver.pid" kube-apiserver || pid_alive "$dir/etcd.pid" etcd; then
    die "a control plane is already running in $dir (use: $0 stop $dir)"
  fi
  touch "$dir/$MARKER"

  local bin=${MEATSPACE_K8S_BIN:-}
  if [[ -z $bin ]]; then
    bin=$("$SCRIPT_DIR/k8s-tools.sh" | tail -n 1) || die "k8s-tools.sh failed"
  fi
  [[ -x $bin/etcd && -x $bin/kube-apiserver ]] || die "etcd/kube-apiserver not found in '$bin'"
  command -v openssl >/dev/null || die "openssl is required"
  command -v curl >/dev/null || die "curl is required"

  local t0=$SECONDS
  gen_certs "$dir"

  local etcd_port etcd_peer_port api_port
  etcd_port=$(free_port); USED_PORTS+=" $etcd_port"
  etcd_peer_port=$(free_port); USED_PORTS+=" $etcd_peer_port"
  api_port=$(free_port)
  local etcd_url="http://127.0.0.1:$etcd_port"
  local api_url="https://127.0.0.1:$api_port"

  log "starting etcd on $etcd_url"
  start_detached "$dir/etcd.pid" "$dir/etcd.log" "$bin/etcd" \
    --name=meatspace \
    --data-dir="$dir/etcd-data" \
    --listen-client-urls="$etcd_url" \
    --advertise-client-urls="$etcd_url" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="meatspace=http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster-state=new \
    --unsafe-no-fsync=true \
    --log-level=warn

  # etcd must answer before the apiserver starts, or the apiserver spends its
  # first seconds in backoff.
  local deadline=$((SECONDS + READY_TIMEOUT))
  until curl -fsS --max-time 2 "$etcd_url/health" 2>/dev/null | grep -q '"health":"true"'; do
    if ! pid_alive "$dir/etcd.pid" etcd; then
      dump_logs "$dir"; die "etcd exited during startup"
    fi
    if (( SECONDS >= deadline )); then
      dump_logs "$dir"; stop_process "$dir/etcd.pid" etcd
      die "etcd not healthy after ${READY_TIMEOUT}s"
    fi
    sleep 0.2
  done

  log "starting kube-apiserver on $api_url"
  # Flags follow envtest's defaults: RBAC, client-cert auth, service-account
  # tokens, and the ServiceAccount admission plugin disabled because there is
  # no controller-manager to create the `default` ServiceAccount. A loopback
  # advertise address is only accepted without the endpoint reconciler (so the
  # `kubernetes` Service in `default` has no endpoints, which nothing here needs).
  start_detached "$dir/kube-apiserver.pid" "$dir/kube-apiserver.log" "$bin/kube-apiserver" \
    --advertise-address=127.0.0.1 \
    --endpoint-reconciler-type=none \
    --bind-address=127.0.0.1 \
    --secure-port="$api_port" \
    --cert-dir="$dir/pki/generated" \
    --tls-cert-file="$dir/pki/apiserver.crt" \
    --tls-private-key-file="$dir/pki/apiserver.key" \
    --client-ca-file="$dir/pki/ca.crt" \
    --authorization-mode=RBAC \
    --etcd-servers="$etcd_url" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --service-account-issuer="$api_url" \
    --service-account-key-file="$dir/pki/sa.pub" \
    --service-account-signing-key-file="$dir/pki/sa.key" \
    --disable-admission-plugins=ServiceAccount \
    --allow-privileged=true \
    --profiling=false \
    --v=1

  local code=""
  until [[ $code == 200 ]]; do
    code=$(curl -sS -o "$dir/readyz.out" -w '%{http_code}' --max-time 5 \
      --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
      "$api_url/readyz" 2>/dev/null || true)
    [[ $code == 200 ]] && break
    if ! pid_alive "$dir/kube-apiserver.pid" kube-apiserver; then
      dump_logs "$dir"; stop_process "$dir/etcd.pid" etcd
      die "kube-apiserver exited during startup"
    fi
    if (( SECONDS >= deadline )); then
      log "last /readyz answer (HTTP ${code:-none}):"; cat "$dir/readyz.out" >&2 2>/dev/null || true
      dump_logs "$dir"
      stop_process "$dir/kube-apiserver.pid" kube-apiserver
      stop_process "$dir/etcd.pid" etcd
      die "kube-apiserver not ready after ${READY_TIMEOUT}s (files kept in $dir)"
    fi
    sleep 0.5
  done
  rm -f "$dir/readyz.out"

  write_kubeconfig "$dir/admin.kubeconfig" "$api_url" "$(b64 "$dir/pki/ca.crt")" meatspace-admin default \
    "client-certificate-data: $(b64 "$dir/pki/admin.crt")" "client-key-data: $(b64 "$dir/pki/admin.key")"
  write_env "$dir/env" "meatspace test control plane in $dir" \
    "KUBECONFIG=$dir/admin.kubeconfig" "MEATSPACE_TEST_KUBECONFIG=$dir/admin.kubeconfig" \
    "MEATSPACE_CP_DIR=$dir" "MEATSPACE_APISERVER_URL=$api_url" "MEATSPACE_ETCD_URL=$etcd_url" \
    "MEATSPACE_APISERVER_PID=$(<"$dir/kube-apiserver.pid")" "MEATSPACE_ETCD_PID=$(<"$dir/etcd.pid")" \
    "MEATSPACE_K8S_BIN=$bin"
  log "ready in $((SECONDS - t0))s: $api_url (source $dir/env)"
  echo "$dir/env"
}

cmd_sa_kubeconfig() {
  [[ $# -eq 4 || $# -eq 5 ]] || usage
  local admin=$1 ns=$2 sa=$3 out=$4 duration=${5:-24h}
  local kubectl=${KUBECTL:-kubectl} server ca token
  [[ -f $admin ]] || die "no kubeconfig at $admin"
  server=$("$kubectl" --kubeconfig "$admin" config view --raw --minify -o 'jsonpath={.clusters[0].cluster.server}')
  ca=$("$kubectl" --kubeconfig "$admin" config view --raw --minify \
    -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')
  [[ -n $server && -n $ca ]] || die "no server or inline CA in $admin"
  token=$("$kubectl" --kubeconfig "$admin" -n "$ns" create token "$sa" \
    --duration="$duration") || die "kubectl create token $ns/$sa failed"
  [[ -n $token ]] || die "empty token for $ns/$sa"
  write_kubeconfig "$out" "$server" "$ca" "$ns-$sa" "$ns" "token: $token"
  log "wrote $out for system:serviceaccount:$ns:$sa"
}

cmd_stop() {
  [[ $# -eq 1 ]] || usage
  local dir=$1
  [[ -d $dir ]] || { log "$dir does not exist; nothing to stop"; return 0; }
  [[ -f $dir/$MARKER ]] || die "$dir was not created by $0 start; refusing to remove it"
  stop_process "$dir/kube-apiserver.pid" kube-apiserver
  stop_process "$dir/etcd.pid" etcd
  rm -rf "$dir"
  log "stopped and removed $dir"
}

run_subcommand "$@"
