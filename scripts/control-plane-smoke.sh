#!/usr/bin/env bash
# control-plane-smoke.sh — quick self-test of scripts/k8s-tools.sh and
# scripts/control-plane.sh: builds (or reuses) the tools, starts a throwaway
# control plane in a temp dir, exercises kubectl, RBAC with a ServiceAccount,
# a ServiceAccount kubeconfig and helm, then stops it. Exits non-zero on any failure.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KUBECTL=${KUBECTL:-kubectl}

step() { printf '\n[smoke] == %s\n' "$*" >&2; }
fail() { printf '[smoke] FAIL: %s\n' "$*" >&2; exit 1; }

# expect_can_i EXPECTED(yes|no) ARGS... — run `kubectl auth can-i` and compare.
expect_can_i() {
  local want=$1; shift
  local got
  got=$("$KUBECTL" auth can-i "$@" 2>/dev/null || true)
  [[ $got == "$want" ]] || fail "kubectl auth can-i $* -> '$got', want '$want'"
  printf '[smoke] can-i %s -> %s (ok)\n' "$*" "$got" >&2
}

step "build/cache tools"
t=$SECONDS
BIN=$("$SCRIPT_DIR/k8s-tools.sh" | tail -n 1)
printf '[smoke] tools in %s (%ss)\n' "$BIN" "$((SECONDS - t))" >&2
export MEATSPACE_K8S_BIN=$BIN

CP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-cp.XXXXXX")
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 && -f $CP_DIR/kube-apiserver.log ]]; then
    echo "[smoke] last lines of kube-apiserver.log:" >&2
    tail -n 30 "$CP_DIR/kube-apiserver.log" >&2
  fi
  "$SCRIPT_DIR/control-plane.sh" stop "$CP_DIR" || rc=1
  exit "$rc"
}
trap cleanup EXIT

step "start control plane in $CP_DIR"
t=$SECONDS
"$SCRIPT_DIR/control-plane.sh" start "$CP_DIR" >/dev/null
printf '[smoke] start took %ss\n' "$((SECONDS - t))" >&2
# shellcheck disable=SC1090
source <("$SCRIPT_DIR/control-plane.sh" env "$CP_DIR")
[[ -f $KUBECONFIG && $MEATSPACE_TEST_KUBECONFIG == "$KUBECONFIG" ]] || fail "env file incomplete"

step "kubectl get ns"
"$KUBECTL" get ns
"$KUBECTL" get ns default -o name | grep -qx 'namespace/default' || fail "no default namespace"
"$KUBECTL" version -o json 2>/dev/null | grep -q '"gitVersion": "v1\.' || fail "server version not reported"

step "namespace, ServiceAccount, Role, RoleBinding"
NS=smoke
SA=robot
"$KUBECTL" create namespace "$NS"
"$KUBECTL" -n "$NS" create serviceaccount "$SA"
"$KUBECTL" -n "$NS" create role configmap-reader --verb=get,list,watch --resource=configmaps
"$KUBECTL" -n "$NS" create rolebinding robot-reads-configmaps --role=configmap-reader \
  --serviceaccount="$NS:$SA"

step "RBAC answers via impersonation"
AS="system:serviceaccount:$NS:$SA"
expect_can_i yes list configmaps -n "$NS" --as="$AS"
expect_can_i yes get configmaps -n "$NS" --as="$AS"
expect_can_i no create configmaps -n "$NS" --as="$AS"
expect_can_i no list secrets -n "$NS" --as="$AS"
expect_can_i no list configmaps -n default --as="$AS"
expect_can_i yes create namespaces   # admin is system:masters

step "ServiceAccount kubeconfig (TokenRequest)"
SA_KUBECONFIG=$CP_DIR/robot.kubeconfig
"$SCRIPT_DIR/control-plane.sh" sa-kubeconfig "$CP_DIR/admin.kubeconfig" "$NS" "$SA" "$SA_KUBECONFIG" 1h
"$KUBECTL" -n "$NS" create configmap hello --from-literal=greeting=hi
[[ $("$KUBECTL" --kubeconfig "$SA_KUBECONFIG" get configmap hello -o jsonpath='{.data.greeting}') == hi ]] \
  || fail "ServiceAccount cannot read the configmap"
whoami=$("$KUBECTL" --kubeconfig "$SA_KUBECONFIG" auth whoami -o jsonpath='{.status.userInfo.username}')
[[ $whoami == "$AS" ]] || fail "token authenticates as '$whoami', want '$AS'"
if "$KUBECTL" --kubeconfig "$SA_KUBECONFIG" -n "$NS" delete configmap hello >/dev/null 2>&1; then
  fail "ServiceAccount could delete a configmap"
fi
echo "[smoke] ServiceAccount token works and is restricted (ok)" >&2

step "helm"
"$BIN/helm" version
"$BIN/helm" version --short | grep -q '^v[34]\.' || fail "helm version unexpected"
"$BIN/helm" create "$CP_DIR/smoke-chart" >/dev/null
"$BIN/helm" install smoke "$CP_DIR/smoke-chart" -n "$NS" >/dev/null || fail "helm install failed"
"$BIN/helm" list -n "$NS" -q | grep -qx smoke || fail "helm list does not show the release"
"$KUBECTL" -n "$NS" get deployment smoke-smoke-chart -o name >/dev/null || fail "chart objects missing"
"$BIN/helm" uninstall smoke -n "$NS" >/dev/null || fail "helm uninstall failed"
echo "[smoke] helm install/list/uninstall (ok)" >&2

step "all checks passed"
echo "[smoke] PASS"
