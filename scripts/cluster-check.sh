#!/usr/bin/env bash
# cluster-check.sh — the Helm chart for real: meatspace's image built here
# (scripts/image.sh), a one-node cluster (scripts/cluster.sh), and the chart
# installed, tested, broken and upgraded in it with traffic flowing:
#
#   1. the image: built from this commit's binaries (the release build, or
#      the ones MEATSPACE_IMAGE_BINARIES names: scripts/test gives it the
#      debug binaries it built for the other suites), its size printed
#   2. helm install with the bundled PostgreSQL (an image built here) into a
#      namespace that enforces the "restricted" Pod Security Standard: every
#      pod Ready (the time it took is printed); helm test passes
#   3. the README's quickstart through the API Service (its ClusterIP, from
#      the node): create, publish, a worker claims and submits a typed result,
#      the agent accepts it; `kubectl get mst` shows the task mirrored by the controller pod
#   4. readiness: the API pods go unready while PostgreSQL is scaled to 0,
#      Ready again when it is back
#   5. two controller replicas: exactly one holds the Lease; its pod is
#      deleted and the other takes over within the lease duration (the time
#      is printed); a task set to expire during the handover expires on time
#      and its MeatspaceTask says so
#   6. helm upgrade to a changed image while a client loop creates tasks and
#      reads their feeds through the Service: no failed request (a 503 with
#      Retry-After is retried, as the client crate does), every created task
#      still there; sent/succeeded/retried/failed printed
#   7. helm uninstall leaves no workload, Service, Secret, ServiceAccount,
#      RBAC object, PodDisruptionBudget or claim of the release (the CRD stays,
#      as the chart documents: crds.keep)
#
# Usage:   scripts/cluster-check.sh        (as root; CI=true: nothing may be missing)
#
# Environment:
#   CARGO_TARGET_DIR               target dir of the release build (scripts/test's)
#   MEATSPACE_IMAGE_BINARIES       a directory with both binaries built: the image
#                                  holds these and no release build runs (image.sh)
#   MEATSPACE_CLUSTER_CHECK_KEEP   1: leave the cluster running (prints its env file)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPTS=$ROOT/scripts
CHART=$ROOT/deploy/helm/meatspace
RELEASE=meatspace
NS=meatspace-check

log() { printf '[cluster-check] %s\n' "$*" >&2; }
die() { printf '[cluster-check] ERROR: %s\n' "$*" >&2; exit 1; }
pass() { printf '[cluster-check] ok: %s\n' "$*" >&2; }
FAILURES=()
fail() { FAILURES+=("$1"); printf '[cluster-check] FAIL: %s\n' "$1" >&2; }
now_ms() { date +%s%3N; }
secs_since() { local t=$(( $(now_ms) - $1 )); printf '%d.%01d' $((t / 1000)) $(((t % 1000) / 100)); }

# ---- prerequisites: a missing one fails, never skips ------------------------------
[[ $(id -u) == 0 ]] || die "needs root (containerd, kubelet, iptables, a bridge); in CI .ci/run runs as root"
for t in buildah iptables conntrack ip curl jq openssl gcc kubectl; do
  command -v "$t" >/dev/null || die "$t is not installed (.ci/run installs the cluster's Debian packages)"
done
[[ -x /bin/busybox && -x /usr/lib/cni/bridge ]] || die "busybox or containernetworking-plugins is not installed"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-cluster-check.XXXXXX")
CLUSTER=$WORK/cluster
LOOP_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -z $LOOP_PID ]] || kill "$LOOP_PID" 2>/dev/null || true
  if ((${#FAILURES[@]})); then
    printf '\n[cluster-check] %d check(s) FAILED:\n' "${#FAILURES[@]}" >&2
    printf '[cluster-check]   - %s\n' "${FAILURES[@]}" >&2
    rc=1
  fi
  if [[ $rc -ne 0 && -d $CLUSTER ]]; then
    log "pods at the failure:"; kubectl get pods -A -o wide >&2 2>/dev/null || true
    kubectl -n "$NS" get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 30 >&2 || true
  fi
  if [[ ${MEATSPACE_CLUSTER_CHECK_KEEP:-} == 1 ]]; then
    log "keeping the cluster: source $CLUSTER/env; stop with: scripts/cluster.sh stop $CLUSTER"
  else
    "$SCRIPTS/cluster.sh" stop "$CLUSTER" || rc=1
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

T_ALL=$SECONDS
# ---- the images ---------------------------------------------------------------------
log "1. images"
t=$SECONDS
APP_TAG=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$CHART/Chart.yaml")
UPGRADE_TAG=$APP_TAG-upgrade
"$SCRIPTS/image.sh" meatspace "$WORK/meatspace.tar" "$APP_TAG" >/dev/null
# The changed image of the upgrade: the same binaries under another name and
# version label (a new image ID, so every pod is replaced).
"$SCRIPTS/image.sh" meatspace "$WORK/meatspace-upgrade.tar" "$UPGRADE_TAG" >/dev/null
mapfile -t SUPPORT < <("$SCRIPTS/image.sh" support "$WORK/images")
image_ref() { local n; for n in "${SUPPORT[@]}"; do [[ ${n%% *} == "meatspace-test/$1:"* ]] && { echo "${n%% *}"; return; }; done; die "no $1 image"; }
PG_IMAGE=$(image_ref postgresql)
BUSYBOX_IMAGE=$(image_ref busybox)
pass "images built ($((SECONDS - t))s); meatspace:$APP_TAG is $(numfmt --to=iec-i --suffix=B "$(stat -c %s "$WORK/meatspace.tar")") as an archive"

# ---- the cluster ----------------------------------------------------------------------
log "2. one-node cluster"
t=$SECONDS
"$SCRIPTS/cluster.sh" start "$CLUSTER" >/dev/null
# shellcheck disable=SC1091 # written by cluster.sh
source "$CLUSTER/env"
HELM=$MEATSPACE_NODE_BIN/helm
"$SCRIPTS/cluster.sh" import "$CLUSTER" "$WORK/meatspace.tar" "$WORK/meatspace-upgrade.tar" "$WORK"/images/*.tar
pass "cluster up and images imported ($((SECONDS - t))s)"
k() { kubectl -n "$NS" "$@"; }
wait_until() {  # SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do ((SECONDS < deadline)) || return 1; sleep 0.5; done
}

# A volume for the bundled PostgreSQL's claim: the cluster has no provisioner.
mkdir -p "$WORK/pv"
install -d -o 70 -g 70 -m 0700 "$WORK/pv/data"
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: meatspace-check-data}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $WORK/pv/data, type: Directory}
EOF
kubectl create namespace "$NS" >/dev/null
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted >/dev/null

cat >"$WORK/values.yaml" <<EOF
# Images built here and imported into the node: never pulled.
image: {pullPolicy: Never}
postgresql:
  image: {repository: ${PG_IMAGE%:*}, tag: "${PG_IMAGE##*:}", pullPolicy: Never}
tests:
  image: {repository: ${BUSYBOX_IMAGE%:*}, tag: "${BUSYBOX_IMAGE##*:}", pullPolicy: Never}
EOF

# ---- install ------------------------------------------------------------------------------
log "3. helm install"
t0=$(now_ms)
"$HELM" install "$RELEASE" "$CHART" -n "$NS" -f "$WORK/values.yaml" --wait --timeout 6m >/dev/null \
  || die "helm install did not get every pod Ready in 6 minutes"
k wait pod --all --for=condition=Ready --timeout=60s >/dev/null
INSTALL_READY=$(secs_since "$t0")
pass "helm install: all $(k get pods --no-headers | wc -l) pods Ready in ${INSTALL_READY}s"
# (Not --logs: the hook pod is deleted once it succeeded.)
if "$HELM" test "$RELEASE" -n "$NS" --timeout 3m >"$WORK/helm-test.out" 2>&1 \
   && grep -Eq '^Phase: +Succeeded$' "$WORK/helm-test.out"; then
  pass "helm test"
else
  sed 's/^/    | /' "$WORK/helm-test.out" >&2; fail "helm test"
fi

API_IP=$(k get service "$RELEASE-api-server" -o jsonpath='{.spec.clusterIP}')
API_PORT=$(k get service "$RELEASE-api-server" -o jsonpath='{.spec.ports[?(@.name=="http")].port}')
H=http://$API_IP:$API_PORT
DEV_KEY=$(k get secret "$RELEASE" -o jsonpath='{.data.dev-key}' | base64 -d)
[[ -n $DEV_KEY ]] || die "no dev key in Secret $RELEASE"

# ---- the README quickstart -------------------------------------------------------------
log "4. the README quickstart through the Service ($H)"
sed -n '/<!-- readme-walk/,/^```$/p' "$ROOT/README.md" | sed -e '1,2d' -e '$d' >"$WORK/quickstart.sh"
[[ -s $WORK/quickstart.sh ]] || die "no readme-walk block in README.md"
if MEATSPACE_URL=$H MEATSPACE_DEV_KEY=$DEV_KEY bash -euo pipefail "$WORK/quickstart.sh" >"$WORK/quickstart.out" 2>"$WORK/quickstart.err" \
   && tail -n 1 "$WORK/quickstart.out" | grep -q '"state":"completed","result":{'; then
  pass "quickstart: $(tr '\n' ' ' <"$WORK/quickstart.out" | cut -c1-200)…"
else
  sed 's/^/    | /' "$WORK/quickstart.out" "$WORK/quickstart.err" >&2; fail "README quickstart through the Service"
fi
# The quickstart's task is the first and only one: its MeatspaceTask.
first_mst() { k get mst -o json | jq -er '.items | if length == 1 then .[0].spec.taskId else empty end'; }
QS_ID=""
if wait_until 60 first_mst; then QS_ID=$(first_mst); fi
mst_state() { k get mst -o json | jq -r --arg id "$1" '.items[] | select(.spec.taskId == $id) | .status.state // ""'; }
mst_is() { [[ $(mst_state "$1") == "$2" ]]; }
if [[ -n $QS_ID ]] && wait_until 60 mst_is "$QS_ID" completed; then
  pass "kubectl get mst: $(k get mst --no-headers | grep -c .) resource(s), the quickstart task $QS_ID completed"
else
  k get mst >&2 || true; fail "the quickstart task ${QS_ID:-?} is not mirrored as completed"
fi

# ---- readiness follows the database ------------------------------------------------------
log "5. API readiness while PostgreSQL is down"
API_SEL=app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/component=api-server
k scale statefulset "$RELEASE-postgresql" --replicas=0 >/dev/null
t0=$(now_ms)
if k wait pod -l "$API_SEL" --for=condition=Ready=false --timeout=90s >/dev/null; then
  pass "API pods unready $(secs_since "$t0")s after PostgreSQL was scaled to 0"
else
  fail "API pods stayed Ready with PostgreSQL down"
fi
# The old PostgreSQL pod may still be shutting down (smart shutdown) when
# the scale-up is asked for, and the API pods' Ready condition can lag
# their probes: "back" means the new PostgreSQL pod is Ready and the API
# answers /readyz through its Service three times running.
k wait pod -l "app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/component=postgresql" \
  --for=delete --timeout=120s >/dev/null 2>&1 || true
k scale statefulset "$RELEASE-postgresql" --replicas=1 >/dev/null
t0=$(now_ms)
api_answers() { curl -sf -m 2 "$H/readyz" >/dev/null; }
api_steady() { api_answers && sleep 1 && api_answers && sleep 1 && api_answers; }
if wait_until 120 k get pod "$RELEASE-postgresql-0" \
   && k wait pod "$RELEASE-postgresql-0" --for=condition=Ready --timeout=120s >/dev/null \
   && k wait pod -l "$API_SEL" --for=condition=Ready --timeout=90s >/dev/null \
   && wait_until 90 api_steady; then
  pass "API pods Ready again $(secs_since "$t0")s after PostgreSQL was scaled back"
else
  fail "API pods not Ready after PostgreSQL came back"
fi

# ---- leader election -----------------------------------------------------------------------
log "6. controller leader handover"
LEASE=$RELEASE-controller
holder() { k get lease "$LEASE" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
CTRL_PODS=$(k get pods -l "app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/component=controller" -o name | wc -l)
LEADER=$(holder)
LEASE_SECS=$(k get lease "$LEASE" -o jsonpath='{.spec.leaseDurationSeconds}')
if [[ $CTRL_PODS -eq 2 && -n $LEADER ]] && k get pod "$LEADER" >/dev/null 2>&1; then
  pass "2 controller pods, the Lease is held by $LEADER (duration ${LEASE_SECS}s)"
  # A task that expires during the handover.
  LIFETIME=20
  EXP=$(curl -sf -XPOST "$H/api/v1/tasks" -H "x-meatspace-dev-key: $DEV_KEY" -H 'content-type: application/json' \
        -d "{\"description\":\"expires during the handover\",\"expires_in_seconds\":$LIFETIME}")
  EXP_ID=$(jq -r .task.id <<<"$EXP"); EXP_TOKEN=$(jq -r .agent_token <<<"$EXP")
  EXP_AT=$(date -d "$(jq -r .task.expires_at <<<"$EXP")" +%s%3N)
  t0=$(now_ms)
  k delete pod "$LEADER" --wait=false >/dev/null
  new_leader() { local h; h=$(holder); [[ -n $h && $h != "$LEADER" ]]; }
  if wait_until $((LEASE_SECS + 30)) new_leader; then
    TAKEOVER=$(secs_since "$t0")
    if (( $(now_ms) - t0 <= LEASE_SECS * 1000 )); then
      pass "$(holder) took the Lease over ${TAKEOVER}s after the leader pod was deleted (within ${LEASE_SECS}s)"
    else
      fail "takeover took ${TAKEOVER}s, more than the lease duration ${LEASE_SECS}s"
    fi
  else
    fail "no other controller took the Lease over"
  fi
  task_state() { curl -sf "$H/api/v1/tasks/$EXP_ID" -H "authorization: Bearer $EXP_TOKEN" | jq -r '.task.state // .state'; }
  is_expired() { [[ $(task_state) == expired ]]; }
  if wait_until $((LIFETIME + 60)) is_expired; then
    late=$(( $(now_ms) - EXP_AT ))
    # The controllers' expiry sweep runs every few seconds: allow 10 s.
    if (( late <= 10000 )); then
      pass "the task expired $((late / 1000))s after its expires_at, across the handover"
    else
      fail "the task expired $((late / 1000))s late"
    fi
    if wait_until 30 mst_is "$EXP_ID" expired; then pass "its MeatspaceTask says expired (mirrored by the new leader)"
    else fail "the expired task's MeatspaceTask is not expired"; fi
  else
    fail "the task did not expire"
  fi
  k rollout status deployment "$RELEASE-controller" --timeout=120s >/dev/null || fail "controller Deployment not back to 2 pods"
else
  fail "expected 2 controller pods and a Lease holder (pods: $CTRL_PODS, holder: ${LEADER:-none})"
fi

# ---- upgrade with traffic ------------------------------------------------------------------
log "7. helm upgrade to $UPGRADE_TAG with traffic"
# traffic — creates a task and reads its feed, over and over, until
# $WORK/stop appears (at most 3000 rounds / 10 minutes). Each request is
# retried only after a 503 with Retry-After; anything else but 2xx fails.
traffic() {
  local out=$WORK/traffic sent=0 ok=0 retried=0 failed=0 round=0
  mkdir -p "$out"; : >"$out/tasks"; : >"$out/failures"
  # req METHOD URL [DATA] — one logical request; its body is left in
  # $out/body. Called in this shell, never in a command substitution: a
  # subshell's counts would be lost, and its failures with them.
  req() {
    local method=$1 url=$2 data=${3:-} code ra attempt
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
      sent=$((sent + 1))
      local args=(-s -o "$out/body" -w '%{http_code} %header{retry-after}' --max-time 15 -X "$method" "$url"
                  -H "x-meatspace-dev-key: $DEV_KEY" -H "idempotency-key: $IKEY")
      [[ -n ${AUTH:-} ]] && args+=(-H "authorization: Bearer $AUTH")
      [[ -n $data ]] && args+=(-H 'content-type: application/json' -d "$data")
      read -r code ra < <(curl "${args[@]}" 2>/dev/null || echo "000 ")
      if [[ $code == 2* ]]; then ok=$((ok + 1)); return 0; fi
      if [[ $code == 503 && -n $ra ]]; then retried=$((retried + 1)); sleep "$ra"; continue; fi
      failed=$((failed + 1))
      printf '%s %s %s -> %s %s\n' "$(date +%T.%3N)" "$method" "$url" "$code" "$(head -c 200 "$out/body" 2>/dev/null)" >>"$out/failures"
      return 1
    done
    failed=$((failed + 1)); echo "$method $url: 503 ten times" >>"$out/failures"; return 1
  }
  local deadline=$((SECONDS + 600)) id token
  while [[ ! -e $WORK/stop ]] && ((round < 3000 && SECONDS < deadline)); do
    round=$((round + 1))
    IKEY=traffic-$round-$RANDOM; AUTH=""
    if req POST "$H/api/v1/tasks" "{\"description\":\"traffic $round\",\"expires_in_seconds\":3600}"; then
      id=$(jq -r .task.id "$out/body"); token=$(jq -r .agent_token "$out/body")
      echo "$id $token" >>"$out/tasks"
      AUTH=$token; IKEY=feed-$round
      req GET "$H/api/v1/tasks/$id/events?after=0" || true
    fi
    printf '%s %s %s %s\n' "$sent" "$ok" "$retried" "$failed" >"$out/counts"
  done
}
traffic &
LOOP_PID=$!
wait_until 30 test -s "$WORK/traffic/counts" || fail "the traffic loop does not run"
t0=$(now_ms)
if "$HELM" upgrade "$RELEASE" "$CHART" -n "$NS" -f "$WORK/values.yaml" --set "image.tag=$UPGRADE_TAG" \
     --wait --timeout 6m >/dev/null; then
  pass "helm upgrade: rolled out in $(secs_since "$t0")s"
else
  fail "helm upgrade did not finish"
fi
# `--wait` returns once the new pods are Ready; the old ones may still be
# draining (preStop, graceful shutdown). Traffic goes on until they are
# gone and a few more requests were answered by the new pods alone.
# A kubectl that fails answers nothing (not "none"), and no_old_pods is false.
old_pods() {
  local images
  images=$(k get pods -l "app.kubernetes.io/instance=$RELEASE" \
    -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}') || return 1
  grep -c ":$APP_TAG\$" <<<"$images" || true
}
no_old_pods() { local n; n=$(old_pods) && [[ $n -eq 0 ]]; }
if wait_until 90 no_old_pods; then
  pass "every meatspace pod runs $UPGRADE_TAG"
else
  fail "$(old_pods || echo "(kubectl failed)") pod(s) still run $APP_TAG 90 s after the rollout"
fi
read -r SENT_AT _ <"$WORK/traffic/counts"
sent_since() { local sent; read -r sent _ <"$WORK/traffic/counts"; ((sent >= SENT_AT + $1)); }
wait_until 30 sent_since 5 || fail "the traffic loop stopped after the rollout"
touch "$WORK/stop"; wait "$LOOP_PID" || true; LOOP_PID=""
read -r SENT OK RETRIED FAILED <"$WORK/traffic/counts"
log "upgrade traffic: sent $SENT, succeeded $OK, retried (503 + Retry-After) $RETRIED, failed $FAILED"
if [[ $FAILED -eq 0 ]]; then pass "no failed request during the upgrade"
else sed 's/^/    | /' "$WORK/traffic/failures" >&2; fail "$FAILED request(s) failed during the upgrade"; fi
lost=0
while read -r id token; do
  curl -sf "$H/api/v1/tasks/$id" -H "authorization: Bearer $token" >/dev/null || lost=$((lost + 1))
done <"$WORK/traffic/tasks"
created=$(wc -l <"$WORK/traffic/tasks")
[[ $lost -eq 0 && $created -gt 0 ]] && pass "all $created tasks created during the upgrade are there" \
  || fail "$lost of $created tasks created during the upgrade are missing"

# ---- uninstall -------------------------------------------------------------------------------
log "8. helm uninstall"
"$HELM" uninstall "$RELEASE" -n "$NS" --wait --timeout 3m >/dev/null || fail "helm uninstall"
# Terminating pods, and the claim the StatefulSet deletes after them.
k wait pod -l "app.kubernetes.io/instance=$RELEASE" --for=delete --timeout=120s >/dev/null 2>&1 || true
k wait pvc -l "app.kubernetes.io/instance=$RELEASE" --for=delete --timeout=60s >/dev/null 2>&1 || true
left=$(k get deployment,statefulset,replicaset,pod,service,secret,serviceaccount,role,rolebinding,poddisruptionbudget,persistentvolumeclaim,configmap \
         -l "app.kubernetes.io/instance=$RELEASE" -o name 2>&1)
# The controller's Lease is made at run time, not by the chart: helm does
# not remove it (known, reported; not counted as the release's).
lease_left=$(k get lease -o name 2>&1)
[[ -z $lease_left ]] || log "note: left behind by the controller, not the chart: $lease_left"
# Objects that are not labelled: anything besides the namespace's own.
left+=$(k get secret,serviceaccount,role,rolebinding -o name 2>&1 | grep -v '^serviceaccount/default$' || true)
if [[ -z $left ]]; then
  pass "nothing of the release is left in $NS (the CRD stays: crds.keep)"
else
  printf '    | %s\n' $left >&2; fail "helm uninstall left objects behind"
fi
kubectl get crd meatspacetasks.meatspace.dev >/dev/null 2>&1 && pass "the CRD is kept" || fail "the CRD was removed despite crds.keep"

log "done in $((SECONDS - T_ALL))s (install to Ready ${INSTALL_READY}s, takeover ${TAKEOVER:-?}s, upgrade sent/succeeded/retried/failed $SENT/$OK/$RETRIED/$FAILED)"
((${#FAILURES[@]} == 0)) || exit 1
printf '[cluster-check] PASS\n' >&2
