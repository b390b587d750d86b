#!/usr/bin/env bash
# helm-check.sh — checks the Helm chart deploy/helm/meatspace against a real
# kube-apiserver:
#
#   1. the chart's CRD copy is the generated deploy/crds/ file
#   2. helm lint --strict: default values and every deploy/helm/meatspace/ci/*-values.yaml
#   3. values.schema.json (and the chart's own checks) reject every
#      tests/fixtures/helm/bad-values/*.yaml, with the expected message
#   4. rendering rules: PodDisruptionBudgets only with replicas > 1, RBAC only
#      with the mirror, the CRD's keep annotation, security contexts, the
#      first operator key's Secret and the API server's auth environment
#   5. helm template | kubectl apply --dry-run=server --validate=strict for every
#      values set, CRDs applied first, in namespaces that enforce the
#      "restricted" Pod Security Standard (any warning is a failure)
#   6. helm install, helm upgrade (twice: same values, then all options) and
#      helm uninstall in a fresh namespace (no --wait: the control plane has
#      no nodes, so pods never run; the objects must be accepted); the
#      generated operator key keeps its value across upgrades
#   7. kubectl auth can-i as the chart's controller ServiceAccount, with a
#      token kubeconfig: it can do what the controller needs and nothing else
#   8. after the default install: the built meatspace-controller binary, run on
#      this machine as the chart's controller ServiceAccount with the environment
#      variables of the installed Deployment (and a fresh PostgreSQL database),
#      mirrors a task created through the API server binary into a MeatspaceTask,
#      holds the chart's Lease and releases it when stopped; the API server binary,
#      given the operator key of the chart's Secret as the Deployment gives it,
#      accepts that key as an operator's
#
# Usage:   MEATSPACE_TEST_KUBECONFIG=… scripts/helm-check.sh
#
# Environment:
#   MEATSPACE_TEST_KUBECONFIG  kubeconfig of the cluster (required; admin rights)
#   MEATSPACE_TEST_POSTGRES_URL  admin URL of a PostgreSQL server (required for part 8;
#                              scripts/postgres.sh start DIR writes it to DIR/env)
#   MEATSPACE_K8S_BIN          directory with helm (default: helm on PATH, else k8s-tools.sh)
#   MEATSPACE_BIN_DIR          directory with the built meatspace binaries (scripts/test's);
#                              else part 8 builds them
#   KUBECTL                    kubectl binary (default: kubectl on PATH)
#   MEATSPACE_HELM_CHECK_KEEP  set to 1 to keep the work directory and namespaces
#
# Exits non-zero when any check fails, after listing every failed check.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHART=$ROOT/deploy/helm/meatspace
GENERATED_CRD=$ROOT/deploy/crds/meatspace.dev_meatspacetasks.yaml
CHART_CRD=$CHART/files/crds/meatspace.dev_meatspacetasks.yaml
FIXTURES=$ROOT/tests/fixtures/helm
CRD_NAME=meatspacetasks.meatspace.dev
RELEASE=meatspace

log() { printf '[helm-check] %s\n' "$*" >&2; }
die() { printf '[helm-check] ERROR: %s\n' "$*" >&2; exit 1; }

FAILURES=()
FINISHED=false  # the script got to its end (else a command aborted it)
# report — the summary of every failed check, and whether the script got
# through all its parts.
report() {
  if ((${#FAILURES[@]})); then
    printf '\n[helm-check] %d check(s) FAILED:\n' "${#FAILURES[@]}" >&2
    printf '[helm-check]   - %s\n' "${FAILURES[@]}" >&2
  fi
  if ! $FINISHED; then
    printf '[helm-check] FAIL: aborted before the last part (see the error above); later checks did not run\n' >&2
  fi
}
# fail MESSAGE [OUTPUT-FILE] — record a failed check and show why.
fail() {
  FAILURES+=("$1")
  printf '[helm-check] FAIL: %s\n' "$1" >&2
  if [[ -n ${2:-} && -s $2 ]]; then sed 's/^/    | /' "$2" >&2; fi
}
pass() { printf '[helm-check] ok: %s\n' "$*" >&2; }

# ---- prerequisites ------------------------------------------------------------
[[ -n ${MEATSPACE_TEST_KUBECONFIG:-} ]] \
  || die "MEATSPACE_TEST_KUBECONFIG is not set (start a control plane: scripts/control-plane.sh start DIR; source DIR/env)"
[[ -f $MEATSPACE_TEST_KUBECONFIG ]] || die "MEATSPACE_TEST_KUBECONFIG=$MEATSPACE_TEST_KUBECONFIG is not a file"
export KUBECONFIG=$MEATSPACE_TEST_KUBECONFIG

KUBECTL=${KUBECTL:-kubectl}
command -v "$KUBECTL" >/dev/null || die "kubectl not found (KUBECTL=$KUBECTL)"
if [[ -n ${MEATSPACE_K8S_BIN:-} && -x $MEATSPACE_K8S_BIN/helm ]]; then
  HELM=$MEATSPACE_K8S_BIN/helm
elif command -v helm >/dev/null; then
  HELM=$(command -v helm)
else
  HELM=$("$ROOT/scripts/k8s-tools.sh" | tail -n 1)/helm
fi
[[ -x $HELM ]] || die "helm not found (PATH, MEATSPACE_K8S_BIN or scripts/k8s-tools.sh)"

k() { "$KUBECTL" "$@"; }
k get --raw /readyz --request-timeout=15s >/dev/null 2>&1 \
  || die "the cluster of $MEATSPACE_TEST_KUBECONFIG does not answer /readyz"
log "helm $("$HELM" version --short), kubectl client $(k version --client -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\([^"]*\)".*/\1/p' | head -n 1), cluster $(k get --raw /version | sed -n 's/.*"gitVersion": "\([^"]*\)".*/\1/p')"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-helm-check.XXXXXX")
SUFFIX=$(tr -dc 'a-z0-9' </dev/urandom | head -c 6 || true)
NS=helm-check-$SUFFIX            # release namespace
MIRROR_NS=helm-check-$SUFFIX-tasks  # mirror namespace of the all-options values
OTHER_NS=helm-check-$SUFFIX-other   # a namespace the controller must not touch
INSTALLED=false

LOCAL_PIDS=()     # processes of part 8, stopped on exit
LOCAL_DB=""       # PostgreSQL database of part 8, dropped on exit
cleanup() {
  local rc=$?
  trap - EXIT
  # An abort (set -e) skips the summary at the end: give it here.
  if [[ $rc -ne 0 ]] && ! $FINISHED; then report; fi
  local pid
  for pid in "${LOCAL_PIDS[@]}"; do
    if kill -TERM "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; fi
  done
  if [[ -n $LOCAL_DB ]]; then
    psql "$MEATSPACE_TEST_POSTGRES_URL" -qc "DROP DATABASE IF EXISTS $LOCAL_DB WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  if [[ ${MEATSPACE_HELM_CHECK_KEEP:-} == 1 ]]; then
    log "keeping $WORK and namespaces $NS $MIRROR_NS $OTHER_NS"
  else
    if $INSTALLED; then "$HELM" uninstall "$RELEASE" -n "$NS" >/dev/null 2>&1 || true; fi
    # Without a controller-manager, namespaces stay Terminating; that is harmless.
    k delete namespace "$NS" "$MIRROR_NS" "$OTHER_NS" --wait=false --ignore-not-found >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT

# Every values set the chart is checked with: the defaults and the ci/ files.
VALUE_SETS=(default)
for f in "$CHART"/ci/*-values.yaml; do VALUE_SETS+=("$(basename "$f" -values.yaml)"); done

# values_args NAME — helm arguments of one values set.
values_args() {
  case $1 in
    default) ;;
    all-options) printf '%s\n' -f "$CHART/ci/all-options-values.yaml" --set "controller.mirror.namespace=$MIRROR_NS" ;;
    *) printf '%s\n' -f "$CHART/ci/$1-values.yaml" ;;
  esac
}

# render NAME OUT [EXTRA HELM ARGS...] — helm template into OUT.
render() {
  local name=$1 out=$2; shift 2
  local args; mapfile -t args < <(values_args "$name")
  "$HELM" template "$RELEASE" "$CHART" -n "$NS" "${args[@]}" "$@" >"$out" 2>"$out.err"
}

# ---- 1. the CRD copy ----------------------------------------------------------
log "1. the chart's CRD is the generated one"
if [[ ! -f $GENERATED_CRD ]]; then
  fail "$GENERATED_CRD is missing (generate it with the crds crate's generator)"
elif ! cmp -s "$GENERATED_CRD" "$CHART_CRD"; then
  diff -u "$GENERATED_CRD" "$CHART_CRD" >"$WORK/crd.diff" 2>&1 || true
  fail "$CHART_CRD is not a copy of $GENERATED_CRD; run: cp deploy/crds/meatspace.dev_meatspacetasks.yaml deploy/helm/meatspace/files/crds/" "$WORK/crd.diff"
else
  pass "files/crds/ matches deploy/crds/"
fi

# ---- 2. lint ------------------------------------------------------------------
log "2. helm lint --strict"
for name in "${VALUE_SETS[@]}"; do
  mapfile -t args < <(values_args "$name")
  if "$HELM" lint --strict "$CHART" -n "$NS" "${args[@]}" >"$WORK/lint.out" 2>&1; then
    pass "lint ($name)"
  else
    fail "helm lint --strict ($name values)" "$WORK/lint.out"
  fi
done

# ---- 3. bad values are rejected --------------------------------------------------
log "3. bad values are rejected"
for f in "$FIXTURES"/bad-values/*.yaml; do
  name=$(basename "$f")
  expect=$(sed -n 's/^# expect: //p' "$f" | head -n 1)
  [[ -n $expect ]] || { fail "$name has no '# expect: …' line"; continue; }
  # The schema fails `helm lint`; the chart's own `fail` checks only fail
  # rendering (helm lint reports them as INFO).
  if ! grep -q '^# rejected by: template$' "$f" \
     && "$HELM" lint --strict "$CHART" -f "$f" >"$WORK/bad.out" 2>&1; then
    fail "helm lint accepted bad values $name" "$WORK/bad.out"
  elif "$HELM" template "$RELEASE" "$CHART" -f "$f" >"$WORK/bad.out" 2>&1; then
    fail "helm template accepted bad values $name" "$WORK/bad.out"
  elif ! grep -qF -- "$expect" "$WORK/bad.out"; then
    fail "bad values $name were rejected, but not with '$expect'" "$WORK/bad.out"
  else
    pass "rejects $name ($expect)"
  fi
done

# ---- 4. rendering rules ---------------------------------------------------------
log "4. rendering rules"
# objects FILE — "Kind/name" of every object in a rendered file.
objects() { awk '/^kind:/{k=$2} /^  name:/{if(k){print k"/"$2; k=""}}' "$1" | sort; }
# has_object FILE KIND/NAME
has_object() { objects "$1" | grep -qx "$2"; }

for name in "${VALUE_SETS[@]}"; do
  render "$name" "$WORK/$name.yaml" || { fail "helm template ($name values)" "$WORK/$name.yaml.err"; continue; }
  objects "$WORK/$name.yaml" >"$WORK/$name.objects"
  log "   $name values render: $(tr '\n' ' ' <"$WORK/$name.objects")"
done

# expect_rule DESCRIPTION COMMAND... — the command must succeed. It is one
# simple command: a pipeline after it (`expect_rule … grep … | grep …`)
# would not be judged by expect_rule at all, so a check that needs one is a
# function (see output_is).
expect_rule() {
  local what=$1; shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}
not() { ! "$@"; }
# output_is WANT COMMAND... — the command succeeds and prints exactly WANT
# (a command that fails, kubectl say, proves nothing).
output_is() {
  local want=$1 got; shift
  if ! got=$("$@"); then
    printf '[helm-check]     %s failed\n' "$1" >&2
    return 1
  fi
  [[ $got == "$want" ]] && return 0
  printf '[helm-check]     %s printed %s, expected %s\n' "$1" "${got:-nothing}" "$want" >&2
  return 1
}
# env_value FILE NAME — the literal value of env variable NAME in a rendering,
# once however many containers have it (two that disagree print both).
env_value() { grep -A1 -E "name: $2\$" "$1" | sed -n 's/^ *value: //p' | sort -u; }
# refused MESSAGE VALUES-SET OUT [ARGS...] — helm template fails and says
# MESSAGE (a rendering that fails for another reason, a mistyped --set say,
# proves nothing).
refused() {
  local want=$1; shift
  if render "$@"; then
    printf '[helm-check]     the %s values rendered\n' "$1" >&2
    return 1
  fi
  grep -qF -- "$want" "$2.err" && return 0
  printf '[helm-check]     the rendering failed, but not saying "%s": %s\n' "$want" "$(head -c 400 "$2.err")" >&2
  return 1
}
# absent NAMESPACE OBJECT — kubectl answers that the object is not found (a
# kubectl that fails for another reason proves nothing).
absent() {
  if k -n "$1" get "$2" -o name >/dev/null 2>"$WORK/absent.err"; then
    printf '[helm-check]     %s exists in %s\n' "$2" "$1" >&2
    return 1
  fi
  grep -q '(NotFound)' "$WORK/absent.err" && return 0
  printf '[helm-check]     kubectl get %s failed: %s\n' "$2" "$(head -c 400 "$WORK/absent.err")" >&2
  return 1
}
# false_switches FILE — how many of MEATSPACE_MIRROR_ENABLED and
# MEATSPACE_LEADER_ELECTION are set to "false".
false_switches() {
  grep -A1 -E 'name: MEATSPACE_(MIRROR_ENABLED|LEADER_ELECTION)$' "$1" | grep -c 'value: "false"'
}
# rendered VALUES-SET — the rules of a values set need its rendering: say so
# when it is missing (a renamed ci/ file, a failed render) rather than skip
# them.
rendered() {
  [[ -f $WORK/$1.yaml && -f $WORK/$1.objects ]] && return 0
  fail "no rendering of the $1 values (is deploy/helm/meatspace/ci/$1-values.yaml missing?): its rules were not checked"
  return 1
}
# variant NAME WHAT ARGS... — the default values rendered with ARGS (--set …)
# into $WORK/NAME.yaml; a rendering that fails is a failure of its own (WHAT
# names the variant), not a skip of the variant's rules.
variant() {
  local name=$1 what=$2
  shift 2
  render default "$WORK/$name.yaml" "$@" && return 0
  fail "helm template with $what" "$WORK/$name.yaml.err"
  return 1
}

if rendered default; then
  d=$WORK/default.yaml
  expect_rule "default: API server PDB (2 replicas)" has_object "$d" PodDisruptionBudget/meatspace-api-server
  expect_rule "default: controller PDB (2 replicas)" has_object "$d" PodDisruptionBudget/meatspace-controller
  expect_rule "default: bundled PostgreSQL StatefulSet" has_object "$d" StatefulSet/meatspace-postgresql
  expect_rule "default: controller Roles" has_object "$d" Role/meatspace-controller-mirror
  expect_rule "default: leader-election Role" has_object "$d" Role/meatspace-controller-leader-election
  expect_rule "default: no ServiceMonitor, NetworkPolicy or Ingress" \
    not grep -Eq '^kind: (ServiceMonitor|NetworkPolicy|Ingress)$' "$d"
  expect_rule "default: the CRD is kept on uninstall" grep -q 'helm.sh/resource-policy: keep' "$d"
  expect_rule "default: the helm test hook" grep -q 'helm.sh/hook: test' "$d"
fi
if variant one "replicas 1" --set apiServer.replicaCount=1 --set controller.replicaCount=1; then
  expect_rule "replicas 1: no PodDisruptionBudget" not grep -q '^kind: PodDisruptionBudget$' "$WORK/one.yaml"
fi
if variant nokeep "crds.keep=false" --set crds.keep=false; then
  expect_rule "crds.keep=false: the CRD is not kept" not grep -q 'helm.sh/resource-policy' "$WORK/nokeep.yaml"
fi
if variant requests "requests enabled" --set controller.mirror.requests.enabled=true; then
  expect_rule "requests on: the mirror defaults to a namespace of its own" \
    output_is "\"$NS-tasks\"" env_value "$WORK/requests.yaml" MEATSPACE_MIRROR_NAMESPACE
fi
expect_rule "requests on: the release namespace is refused as the mirror's" \
  refused "give the mirror a namespace of its own" \
    default "$WORK/requests-here.yaml" --set controller.mirror.requests.enabled=true \
    --set "controller.mirror.namespace=$NS"
if [[ -f $WORK/default.yaml ]]; then
  expect_rule "default: MEATSPACE_PUBLIC_URL is the in-cluster Service" \
    output_is "\"http://meatspace-api-server.$NS.svc\"" env_value "$WORK/default.yaml" MEATSPACE_PUBLIC_URL
fi
if variant ingress "an Ingress" --set ingress.enabled=true \
     --set 'ingress.tls[0].secretName=t' --set 'ingress.tls[0].hosts[0]=meatspace.example.test'; then
  expect_rule "ingress with TLS: MEATSPACE_PUBLIC_URL is its https host" \
    output_is '"https://meatspace.example.test"' env_value "$WORK/ingress.yaml" MEATSPACE_PUBLIC_URL
fi
if variant nocrd "crds.install=false" --set crds.install=false; then
  expect_rule "crds.install=false: no CRD" not grep -q '^kind: CustomResourceDefinition$' "$WORK/nocrd.yaml"
fi
# secret_kept FILE NAME — the rendered Secret NAME has helm.sh/resource-policy: keep.
secret_kept() {
  awk -v want="  name: $2" '
    /^---/ { secret = 0; named = 0 }
    /^kind: Secret$/ { secret = 1 }
    secret && $0 == want { named = 1 }
    secret && named && /helm\.sh\/resource-policy: keep/ { kept = 1 }
    END { exit !kept }' "$1"
}
# env_secret FILE NAME — "secret/key" that env variable NAME is read from.
env_secret() {
  grep -A4 -E "name: $2\$" "$1" | awk '/^ *name: /&&NR>1{n=$2} /^ *key: /{print n"/"$2}'
}
if variant smtp "an SMTP server" --set notifications.smtp.host=smtp.example.test \
     --set notifications.smtp.passwordSecret=smtp-credentials; then
  expect_rule "smtp: the controller sends email through the configured host" \
    output_is '"smtp.example.test"' env_value "$WORK/smtp.yaml" MEATSPACE_SMTP_HOST
  expect_rule "smtp: the password comes from the named Secret, never a literal" \
    output_is '"smtp-credentials"/"smtp-password"' env_secret "$WORK/smtp.yaml" MEATSPACE_SMTP_PASSWORD
fi
if [[ -f $WORK/default.yaml ]]; then
  expect_rule "default: no SMTP server, so no email settings" \
    not grep -q 'name: MEATSPACE_SMTP_HOST' "$WORK/default.yaml"
fi
if rendered default; then
  d=$WORK/default.yaml
  expect_rule "default: the chart creates the first operator key's Secret" \
    has_object "$d" Secret/meatspace-operator-key
  expect_rule "default: the API server reads MEATSPACE_BOOTSTRAP_OPERATOR_KEY from it" \
    output_is meatspace-operator-key/operator-key env_secret "$d" MEATSPACE_BOOTSTRAP_OPERATOR_KEY
  expect_rule "default: the development key stays on (MEATSPACE_DEV_KEY_ENABLED=true)" \
    output_is '"true"' env_value "$d" MEATSPACE_DEV_KEY_ENABLED
  expect_rule "default: the operator key is not kept on uninstall (the bundled database is not)" \
    not secret_kept "$d" meatspace-operator-key
fi
if variant nokey "auth.operatorKey.create=false" --set auth.operatorKey.create=false; then
  expect_rule "auth.operatorKey.create=false: no operator key Secret, no bootstrap variable" \
    not grep -Eq 'meatspace-operator-key|MEATSPACE_BOOTSTRAP_OPERATOR_KEY' "$WORK/nokey.yaml"
fi
if rendered external-database; then
  e=$WORK/external-database.yaml
  expect_rule "production-like values: the development key is off (MEATSPACE_DEV_KEY_ENABLED=false)" \
    output_is '"false"' env_value "$e" MEATSPACE_DEV_KEY_ENABLED
  expect_rule "production-like values: the operator key Secret is kept on uninstall (the database outlives the release)" \
    secret_kept "$e" meatspace-operator-key
  expect_rule "mirror off: no Role, no RoleBinding" not grep -Eq '^kind: (Role|RoleBinding)$' "$e"
  expect_rule "mirror off: the controller mounts no token" \
    not grep -q 'automountServiceAccountToken: true' "$e"
  expect_rule "mirror off: MEATSPACE_MIRROR_ENABLED=false, leader election off" \
    output_is 2 false_switches "$e"
fi
if rendered existing-secret; then
  s=$WORK/existing-secret.yaml
  expect_rule "existing Secret: the chart creates no Secret" not grep -q '^kind: Secret$' "$s"
  expect_rule "existing Secret: the operator key comes from auth.operatorKey.existingSecret" \
    output_is meatspace-operator-key/MEATSPACE_BOOTSTRAP_OPERATOR_KEY env_secret "$s" MEATSPACE_BOOTSTRAP_OPERATOR_KEY
  expect_rule "existing Secret: the pods read it by its keys" \
    output_is 5 grep -c -E 'name: meatspace-credentials$' "$s"
  expect_rule "leader election off: no Lease Role" not has_object "$s" Role/meatspace-controller-leader-election
fi

# ---- 5. server-side validation ----------------------------------------------------
log "5. kubectl apply --dry-run=server"
make_namespace() {
  k create namespace "$1" >/dev/null
  # The apiserver's PodSecurity admission then checks every pod template.
  k label namespace "$1" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/warn=restricted pod-security.kubernetes.io/audit=restricted >/dev/null
}
make_namespace "$NS"
make_namespace "$MIRROR_NS"
make_namespace "$OTHER_NS"

# apply_crd FILE — create or update a CRD for real and wait until it is served.
apply_crd() {
  k apply --server-side --force-conflicts --field-manager=meatspace-helm-check -f "$1" >"$WORK/crd.out" 2>&1 \
    && k wait --for condition=established --timeout=60s -f "$1" >>"$WORK/crd.out" 2>&1
}
apply_crd "$CHART_CRD" || fail "applying the chart's CRD" "$WORK/crd.out"
apply_crd "$FIXTURES/servicemonitor-crd.yaml" || fail "applying the ServiceMonitor CRD fixture" "$WORK/crd.out"

# What the apiserver accepted, one line per object and per container, with
# each container's hardening; PodSecurity "restricted" covers the rest.
CONTAINER='container {.name} readOnlyRootFilesystem={.securityContext.readOnlyRootFilesystem} allowPrivilegeEscalation={.securityContext.allowPrivilegeEscalation} drop={.securityContext.capabilities.drop}{"\n"}'
ACCEPTED="{range .items[*]}object {.kind}/{.metadata.name}{\"\\n\"}{range .spec.template.spec.containers[*]}$CONTAINER{end}{range .spec.containers[*]}$CONTAINER{end}{end}"
HARDENED='readOnlyRootFilesystem=true allowPrivilegeEscalation=false drop=["ALL"]'
for name in "${VALUE_SETS[@]}"; do
  [[ -f $WORK/$name.yaml ]] || continue
  if ! k apply --server-side --force-conflicts --field-manager=meatspace-helm-check \
       --dry-run=server --validate=strict -f "$WORK/$name.yaml" -o "jsonpath=$ACCEPTED" \
       >"$WORK/accepted.out" 2>"$WORK/dry.err" || grep -q . "$WORK/dry.err"; then
    # Any warning (PodSecurity, deprecation, unknown field) fails too.
    fail "kubectl apply --dry-run=server ($name values)" "$WORK/dry.err"
    continue
  fi
  n_rendered=$(wc -l <"$WORK/$name.objects")
  n_accepted=$(grep -c '^object ' "$WORK/accepted.out" || true)
  # The helm test Pod is a hook: helm template renders it too.
  if [[ $n_accepted -ne $n_rendered ]]; then
    fail "dry-run ($name values): $n_accepted of $n_rendered objects came back" "$WORK/accepted.out"
    continue
  fi
  if grep '^container ' "$WORK/accepted.out" | grep -vF -- "$HARDENED" >"$WORK/soft.out"; then
    fail "dry-run ($name values): containers without the hardened security context" "$WORK/soft.out"
    continue
  fi
  pass "dry-run=server ($name values): $n_accepted objects accepted, $(grep -c '^container ' "$WORK/accepted.out") containers hardened"
done

# ---- 6. install, upgrade, uninstall ---------------------------------------------------
log "6. helm install / upgrade / uninstall in namespace $NS"
# The CRD already exists (applied above, or by other tests); Helm adopts an
# existing object only when it carries the release's ownership metadata.
adopt_crd() {
  k annotate --overwrite crd "$CRD_NAME" meta.helm.sh/release-name="$RELEASE" \
    meta.helm.sh/release-namespace="$NS" >/dev/null \
    && k label --overwrite crd "$CRD_NAME" app.kubernetes.io/managed-by=Helm >/dev/null
}
secret_value() { # NAME KEY
  k -n "$NS" get secret "$1" -o "jsonpath={.data.$2}" 2>/dev/null | base64 -d
}
helm_ok() { # DESCRIPTION ARGS...
  local what=$1; shift
  if "$HELM" "$@" >"$WORK/helm.out" 2>&1; then pass "$what"; return 0; fi
  fail "$what" "$WORK/helm.out"; return 1
}

adopt_crd || fail "annotating the existing CRD for adoption by the release"
if helm_ok "helm install (default values)" install "$RELEASE" "$CHART" -n "$NS" --timeout 2m; then
  INSTALLED=true
  expect_rule "install: NOTES tell how to reach the API" grep -q "port-forward service/meatspace-api-server" "$WORK/helm.out"
  expect_rule "install: NOTES tell how to get the dev key" grep -q "get secret meatspace" "$WORK/helm.out"
  expect_rule "install: NOTES tell how to read the operator key" \
    grep -q "get secret meatspace-operator-key" "$WORK/helm.out"
  for obj in deployment/meatspace-api-server deployment/meatspace-controller statefulset/meatspace-postgresql \
             service/meatspace-api-server secret/meatspace secret/meatspace-operator-key \
             serviceaccount/meatspace-controller \
             role/meatspace-controller-mirror rolebinding/meatspace-controller-leader-election \
             poddisruptionbudget/meatspace-api-server; do
    k -n "$NS" get "$obj" >/dev/null 2>&1 || fail "install: $obj does not exist"
  done
  expect_rule "install: the API server mounts no ServiceAccount token" \
    grep -qx false <(k -n "$NS" get deployment meatspace-api-server -o 'jsonpath={.spec.template.spec.automountServiceAccountToken}')
  expect_rule "install: the controller mounts its token (the mirror is on)" \
    grep -qx true <(k -n "$NS" get deployment meatspace-controller -o 'jsonpath={.spec.template.spec.automountServiceAccountToken}')
  expect_rule "install: the CRD belongs to the release" \
    grep -qx "$RELEASE" <(k get crd "$CRD_NAME" -o 'jsonpath={.metadata.annotations.meta\.helm\.sh/release-name}')
  dev_key=$(secret_value meatspace dev-key)
  pg_password=$(secret_value meatspace-postgresql password)
  db_url=$(secret_value meatspace database-url)
  expect_rule "install: a dev key was generated" grep -Eq '^msd_[A-Za-z0-9]{40}$' <<<"$dev_key"
  operator_key=$(secret_value meatspace-operator-key operator-key)
  expect_rule "install: an operator key msk_<32 hex>_<43 characters> was generated" \
    grep -Eq '^msk_[0-9a-f]{32}_[A-Za-z0-9]{43}$' <<<"$operator_key"
  expect_rule "install: DATABASE_URL points at the bundled PostgreSQL with its password" \
    test "$db_url" = "postgres://meatspace:$pg_password@meatspace-postgresql.$NS.svc:5432/meatspace"

  if helm_ok "helm upgrade (default values, 3 API replicas)" upgrade "$RELEASE" "$CHART" -n "$NS" \
       --set apiServer.replicaCount=3; then
    expect_rule "upgrade: the generated dev key is kept" test "$(secret_value meatspace dev-key)" = "$dev_key"
    expect_rule "upgrade: the generated operator key is kept" \
      test "$(secret_value meatspace-operator-key operator-key)" = "$operator_key"
    expect_rule "upgrade: the generated PostgreSQL password is kept" \
      test "$(secret_value meatspace-postgresql password)" = "$pg_password"
    expect_rule "upgrade: 3 API server replicas" \
      grep -qx 3 <(k -n "$NS" get deployment meatspace-api-server -o 'jsonpath={.spec.replicas}')
  fi
fi

# ---- 7. the controller's identity --------------------------------------------------------
log "7. kubectl auth can-i as the chart's ServiceAccounts"
# sa_kubeconfig NAMESPACE SA OUT — a kubeconfig of the cluster that authenticates
# with a token of SA.
sa_kubeconfig() {
  KUBECTL=$KUBECTL "$ROOT/scripts/control-plane.sh" sa-kubeconfig "$KUBECONFIG" "$1" "$2" "$3" 1h 2>"$WORK/mint.err"
}

# can KUBECONFIG yes|no VERB RESOURCE [ARGS...] — kubectl auth can-i must answer as expected.
can() {
  local kc=$1 want=$2; shift 2
  local got
  got=$(KUBECONFIG=$kc k auth can-i "$@" 2>"$WORK/can.err") || true
  if [[ $got == "$want" ]]; then
    return 0
  fi
  fail "as $(basename "$kc" .kubeconfig): can-i $* answered '${got:-error}', expected '$want'" "$WORK/can.err"
}

# rules KUBECONFIG NAMESPACE — the resource rules of an identity in a namespace, normalised.
rules() {
  KUBECONFIG=$1 k auth can-i --list -n "$2" --no-headers 2>/dev/null \
    | awk '$1 !~ /^\[/ {$1=$1; print}' | sort -u
}

# check_controller_identity SA MIRROR_NS LEASE EVENTS(yes|no) REQUESTS(yes|no) — the controller's permissions, exactly.
check_controller_identity() {
  local sa=$1 mirror=$2 lease=$3 events=$4 requests=$5 failed_before=${#FAILURES[@]}
  local ctl=$WORK/controller-$sa.kubeconfig api=$WORK/api-server.kubeconfig
  sa_kubeconfig "$NS" "$sa" "$ctl" || { fail "minting a token kubeconfig for $NS/$sa" "$WORK/mint.err"; return; }
  local mst=meatspacetasks.meatspace.dev lease_res=leases.coordination.k8s.io v
  for v in get list watch create patch delete; do can "$ctl" yes "$v" "$mst" -n "$mirror"; done
  can "$ctl" yes get "$mst" --subresource=status -n "$mirror"
  can "$ctl" yes patch "$mst" --subresource=status -n "$mirror"
  can "$ctl" "$events" create events -n "$mirror"
  # Requested tasks: the agent-token Secrets, by name only (no list or watch).
  for v in create get delete; do can "$ctl" "$requests" "$v" secrets -n "$mirror"; done
  can "$ctl" no patch secrets -n "$mirror"
  can "$ctl" no watch secrets -n "$mirror"
  can "$ctl" no update secrets -n "$mirror"
  can "$ctl" yes create "$lease_res" -n "$NS"
  can "$ctl" yes get "$lease_res/$lease" -n "$NS"
  can "$ctl" yes update "$lease_res/$lease" -n "$NS"
  # … and nothing else.
  can "$ctl" no update "$mst" -n "$mirror"
  can "$ctl" no deletecollection "$mst" -n "$mirror"
  can "$ctl" no update "$mst" --subresource=status -n "$mirror"
  can "$ctl" no get "$mst" -n "$OTHER_NS"
  can "$ctl" no list "$mst" --all-namespaces
  can "$ctl" no list secrets -n "$NS"
  can "$ctl" no get secrets/meatspace -n "$NS"
  can "$ctl" no list secrets -n "$mirror"
  can "$ctl" no list configmaps -n "$NS"
  can "$ctl" no create pods -n "$NS"
  can "$ctl" no create serviceaccounts/token -n "$NS"
  can "$ctl" no delete "$lease_res/$lease" -n "$NS"
  can "$ctl" no patch "$lease_res/$lease" -n "$NS"
  can "$ctl" no list "$lease_res" -n "$NS"
  can "$ctl" no get "$lease_res/some-other-lease" -n "$NS"
  can "$ctl" no update "$lease_res/some-other-lease" -n "$NS"
  can "$ctl" no create "$lease_res" -n "$OTHER_NS"
  can "$ctl" no create customresourcedefinitions
  can "$ctl" no list namespaces
  can "$ctl" no create roles -n "$NS"
  can "$ctl" no impersonate serviceaccounts -n "$NS"
  can "$ctl" no '*' '*' -n "$mirror"

  # Exactly: the controller's rules are the baseline every ServiceAccount has
  # (seen through the API server's identity, which has no bindings of its own)
  # plus the chart's rules, in each namespace.
  sa_kubeconfig "$NS" "$API_SA" "$api" || { fail "minting a token kubeconfig for $NS/$API_SA" "$WORK/mint.err"; return; }
  can "$api" no list "$mst" -n "$NS"
  can "$api" no get secrets -n "$NS"
  local ns expected
  for ns in $(printf '%s\n' "$NS" "$mirror" "$OTHER_NS" | sort -u); do
    expected=$(
      rules "$api" "$ns"
      if [[ $ns == "$mirror" ]]; then
        if [[ $events == yes ]]; then
          echo "events [] [] [create patch]"
          echo "events.events.k8s.io [] [] [create patch]"
        fi
        if [[ $requests == yes ]]; then
          echo "secrets [] [] [create get delete]"
        fi
        echo "$mst [] [] [get list watch create patch delete]"
        echo "$mst/status [] [] [get patch]"
      fi
      if [[ $ns == "$NS" ]]; then
        echo "$lease_res [] [] [create]"
        echo "$lease_res [] [$lease] [get update]"
      fi
    )
    if diff <(sort -u <<<"$expected") <(rules "$ctl" "$ns") >"$WORK/rules.diff"; then
      pass "$sa has exactly the expected rules in namespace $ns"
    else
      fail "$sa's rules in namespace $ns differ from the expected ones (< expected, > actual)" "$WORK/rules.diff"
    fi
  done
  if ((${#FAILURES[@]} == failed_before)); then
    pass "kubectl auth can-i as $NS/$sa (mirror namespace $mirror, Lease $lease): every expected answer"
  fi
}

# check_controller_env SA MIRROR_NS LEASE RETENTION_SECONDS — the installed
# controller gets the contract's environment variables (names exactly),
# pointing at its mirror namespace and Lease. The same list is what a locally
# run controller needs (part 8 runs one with it).
check_controller_env() {
  local sa=$1 mirror=$2 lease=$3 retention=$4
  k -n "$NS" get deployment meatspace-controller \
    -o 'jsonpath={range .spec.template.spec.containers[0].env[*]}{.name}={.value}{"\n"}{end}' \
    | sort >"$WORK/controller.env"
  # Besides the contract: the task policy and extraEnv of the all-options values.
  local extra
  mapfile -t extra < <(sed -n -e '/^MEATSPACE_RETENTION_SECONDS=/d' \
    -e 's/^\(MEATSPACE_CONTROLLER_BATCH_SIZE\|MEATSPACE_[A-Z_]*_SECONDS\)=.*/\1/p' "$WORK/controller.env")
  if diff <(printf '%s\n' DATABASE_URL MEATSPACE_SECRET_KEY MEATSPACE_CONTROLLER_LISTEN_ADDR MEATSPACE_RETENTION_SECONDS RUST_LOG \
              MEATSPACE_LOG_FORMAT MEATSPACE_MIRROR_ENABLED MEATSPACE_MIRROR_NAMESPACE \
              MEATSPACE_REQUESTS_ENABLED MEATSPACE_KUBERNETES_EVENTS \
              MEATSPACE_LEADER_ELECTION MEATSPACE_LEASE_NAME POD_NAME POD_NAMESPACE \
              MEATSPACE_PUBLIC_URL MEATSPACE_NOTIFY_HOURLY_CAP "${extra[@]}" | sort) \
            <(cut -d= -f1 "$WORK/controller.env") >"$WORK/env.diff"; then
    pass "the controller ($sa) gets the contract's environment variables"
  else
    fail "the controller's environment variables differ from the contract (< contract, > chart)" "$WORK/env.diff"
  fi
  local want
  # The controller reads seconds; the chart's value is in days.
  for want in MEATSPACE_MIRROR_ENABLED=true "MEATSPACE_MIRROR_NAMESPACE=$mirror" MEATSPACE_LEADER_ELECTION=true \
              "MEATSPACE_LEASE_NAME=$lease" MEATSPACE_CONTROLLER_LISTEN_ADDR=0.0.0.0:9091 \
              "MEATSPACE_RETENTION_SECONDS=$retention"; do
    grep -qxF -- "$want" "$WORK/controller.env" || fail "the controller ($sa) is not given $want" "$WORK/controller.env"
  done
  grep -qx "$sa" <(k -n "$NS" get deployment meatspace-controller -o 'jsonpath={.spec.template.spec.serviceAccountName}') \
    || fail "the controller does not run as ServiceAccount $sa"
}

# ---- 8. the controller binary as the chart runs it ---------------------------------------
# free_port — a TCP port on 127.0.0.1 that nothing listens on.
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return 0; }
  done
  return 1
}

# wait_http URL SECONDS — until URL answers 2xx.
wait_http() {
  local deadline=$((SECONDS + $2))
  until curl -fsS --max-time 2 -o /dev/null "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# stop_local PID — SIGTERM and wait; the exit status goes to STOPPED_RC.
stop_local() {
  STOPPED_RC=0
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || STOPPED_RC=$?
  local pid rest=()
  for pid in "${LOCAL_PIDS[@]}"; do [[ $pid == "$1" ]] || rest+=("$pid"); done
  LOCAL_PIDS=("${rest[@]}")
}

# check_local_controller SA MIRROR_NS LEASE — runs target/debug/meatspace-controller
# here with the environment the installed Deployment gives the controller: every
# literal value as rendered, except the listen address (a free local port instead
# of 0.0.0.0:9091); DATABASE_URL (a Secret in the cluster) a fresh database on the
# test PostgreSQL server; POD_NAME and POD_NAMESPACE (pod fields) a local stand-in
# and the release namespace; and KUBECONFIG, a token kubeconfig of SA, in place of
# the in-cluster service account. The API server binary runs beside it on the same
# database with MEATSPACE_EMBEDDED_CONTROLLER=never, as in the chart. A task created
# and published over HTTP must appear as a MeatspaceTask with its status.
check_local_controller() {
  local sa=$1 mirror=$2 lease=$3 failed_before=${#FAILURES[@]}
  if [[ -z ${MEATSPACE_TEST_POSTGRES_URL:-} ]]; then
    fail "part 8 needs MEATSPACE_TEST_POSTGRES_URL (start a server: scripts/postgres.sh start DIR; source DIR/env)"
    return
  fi
  command -v psql >/dev/null || { fail "part 8 needs psql"; return; }
  command -v jq >/dev/null || { fail "part 8 needs jq"; return; }
  # The binaries scripts/test built (MEATSPACE_BIN_DIR), else a build of them.
  local bin=${MEATSPACE_BIN_DIR:-}
  if [[ -z $bin ]]; then
    log "   building meatspace-controller and meatspace-api-server"
    if ! (cd "$ROOT" && cargo build --workspace --bins --locked) >"$WORK/build.log" 2>&1; then
      fail "cargo build --workspace --bins" "$WORK/build.log"
      return
    fi
    bin=${CARGO_TARGET_DIR:-$ROOT/target}/debug
  fi
  [[ -x $bin/meatspace-controller && -x $bin/meatspace-api-server ]] \
    || { fail "the built binaries are not in $bin"; return; }

  # A fresh database on the test server.
  LOCAL_DB=helm_check_${SUFFIX}
  psql "$MEATSPACE_TEST_POSTGRES_URL" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $LOCAL_DB" >"$WORK/psql.out" 2>&1 \
    || { fail "creating database $LOCAL_DB on the test PostgreSQL server" "$WORK/psql.out"; LOCAL_DB=""; return; }
  local admin_url=$MEATSPACE_TEST_POSTGRES_URL base query db_url
  base=${admin_url%%\?*}; query=${admin_url#"$base"}
  db_url="${base%/*}/$LOCAL_DB$query"

  local kubeconfig=$WORK/local-controller.kubeconfig
  sa_kubeconfig "$NS" "$sa" "$kubeconfig" || { fail "minting a token kubeconfig for $NS/$sa" "$WORK/mint.err"; return; }

  # The Deployment's environment, one JSON object per variable.
  local pod=helm-check-local-$SUFFIX ctl_port api_port
  ctl_port=$(free_port) || { fail "no free local port"; return; }
  api_port=$(free_port) || { fail "no free local port"; return; }
  [[ $api_port != "$ctl_port" ]] || api_port=$((ctl_port + 1))
  local env=() name value line secret_key
  secret_key=$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 48 || true)
  k -n "$NS" get deployment meatspace-controller -o json \
    | jq -c '.spec.template.spec.containers[0].env[]' >"$WORK/deployment.env" \
    || { fail "reading the controller Deployment's environment"; return; }
  while IFS= read -r line; do
    name=$(jq -r .name <<<"$line")
    case $name in
      DATABASE_URL) value=$db_url ;;
      # From the Secret in the cluster; locally the same key as the API server's.
      MEATSPACE_SECRET_KEY) value=$secret_key ;;
      POD_NAME) value=$pod ;;
      POD_NAMESPACE) value=$NS ;;
      MEATSPACE_CONTROLLER_LISTEN_ADDR) value=127.0.0.1:$ctl_port ;;
      *)
        if ! jq -e 'has("value")' >/dev/null <<<"$line"; then
          fail "the controller's $name comes from $(jq -c .valueFrom <<<"$line"); part 8 cannot supply it locally"
          return
        fi
        value=$(jq -r .value <<<"$line")
        ;;
    esac
    env+=("$name=$value")
  done <"$WORK/deployment.env"
  env+=("KUBECONFIG=$kubeconfig")
  printf '%s\n' "${env[@]}" | sed -e 's#^\(DATABASE_URL=\).*#\1(the test database)#' -e 's#^\(MEATSPACE_SECRET_KEY=\).*#\1(redacted)#' >"$WORK/local-controller.env"

  local ctl_pid api_pid
  env -i PATH="$PATH" HOME="$HOME" "${env[@]}" "$bin/meatspace-controller" >"$WORK/local-controller.log" 2>&1 &
  ctl_pid=$!; LOCAL_PIDS+=("$ctl_pid")
  local dev_key
  dev_key=msd_$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 40 || true)
  # The first operator key as the chart's API server gets it: from the
  # Secret the chart generated, and the dev key switch as rendered.
  local dev_key_enabled
  dev_key_enabled=$(k -n "$NS" get deployment meatspace-api-server -o json \
    | jq -r '.spec.template.spec.containers[0].env[] | select(.name == "MEATSPACE_DEV_KEY_ENABLED") | .value')
  env -i PATH="$PATH" HOME="$HOME" DATABASE_URL="$db_url" MEATSPACE_DEV_KEY="$dev_key" MEATSPACE_SECRET_KEY="$secret_key" \
    MEATSPACE_DEV_KEY_ENABLED="$dev_key_enabled" MEATSPACE_BOOTSTRAP_OPERATOR_KEY="$operator_key" \
    MEATSPACE_LISTEN_ADDR="127.0.0.1:$api_port" MEATSPACE_METRICS_LISTEN_ADDR=127.0.0.1:0 MEATSPACE_EMBEDDED_CONTROLLER=never RUST_LOG=info \
    "$bin/meatspace-api-server" >"$WORK/local-api-server.log" 2>&1 &
  api_pid=$!; LOCAL_PIDS+=("$api_pid")

  local ctl_url=http://127.0.0.1:$ctl_port api_url=http://127.0.0.1:$api_port
  if ! wait_http "$ctl_url/readyz" 60; then
    fail "the locally run controller (environment of the chart) did not become ready" "$WORK/local-controller.log"
    return
  fi
  if ! wait_http "$api_url/readyz" 60; then
    fail "the locally run API server did not become ready" "$WORK/local-api-server.log"
    return
  fi
  # The chart's operator key is an operator's key to this server.
  local keys
  if keys=$(curl -fsS --max-time 10 "$api_url/api/v1/keys" -H "authorization: Bearer $operator_key" 2>"$WORK/curl.err"); then
    expect_rule "local API server: the chart's operator key lists the keys, as the bootstrap operator's" \
      output_is "operator" jq -r --arg id "${operator_key:4:32}" \
        '.keys[] | select((.id | gsub("-"; "")) == $id) | .principal.kind' <<<"$keys"
  else
    fail "local API server: GET /api/v1/keys with the chart's operator key" "$WORK/curl.err"
  fi
  grep -qF -- "${operator_key#msk_*_}" "$WORK/local-api-server.log" \
    && fail "the operator key's secret appears in the API server's log"
  local description="helm-check $SUFFIX: read the meter in the basement" created id token
  created=$(curl -fsS --max-time 10 -X POST "$api_url/api/v1/tasks" -H "x-meatspace-dev-key: $dev_key" \
    -H 'content-type: application/json' -d "$(jq -nc --arg d "$description" '{description: $d}')" 2>"$WORK/curl.err") \
    || { fail "creating a task through the API server" "$WORK/curl.err"; return; }
  id=$(jq -r .task.id <<<"$created"); token=$(jq -r .agent_token <<<"$created")
  curl -fsS --max-time 10 -X POST "$api_url/api/v1/tasks/$id/publish" -H "authorization: Bearer $token" \
    >/dev/null 2>"$WORK/curl.err" || { fail "publishing the task" "$WORK/curl.err"; return; }

  # The MeatspaceTask, with the state, description and last event the API has.
  local last_event
  last_event=$(curl -fsS --max-time 10 "$api_url/api/v1/tasks/$id/events?after=0" -H "authorization: Bearer $token" \
    2>"$WORK/curl.err" | jq -r '.events[-1].id') || { fail "reading the task's events" "$WORK/curl.err"; return; }
  local deadline=$((SECONDS + 15)) got=""
  until [[ $got == "open $last_event $description" ]]; do
    got=$(k -n "$mirror" get meatspacetask "$id" -o 'jsonpath={.status.state} {.status.lastEventId} {.spec.description}' 2>/dev/null || true)
    if ((SECONDS >= deadline)); then
      printf 'the resource says: %s\n' "${got:-(missing)}" >"$WORK/mst.out"
      fail "the task created over HTTP does not appear as an open MeatspaceTask in $mirror within 15s" "$WORK/mst.out"
      sed 's/^/    | /' "$WORK/local-controller.log" | tail -n 30 >&2
      break
    fi
    sleep 0.2
  done
  if k -n "$mirror" get meatspacetask "$id" -o json >"$WORK/mst.json" 2>"$WORK/mst.err"; then
    grep -qF -- "$token" "$WORK/mst.json" && fail "the agent token appears in the MeatspaceTask"
  else
    fail "reading MeatspaceTask $id to look for the agent token" "$WORK/mst.err"
  fi
  expect_rule "local controller: it holds the chart's Lease $lease as $pod" \
    output_is "$pod" k -n "$NS" get lease "$lease" -o 'jsonpath={.spec.holderIdentity}'
  expect_rule "local controller: /metrics counts its writes to $mirror" \
    grep -q "meatspace_mirror_writes_total{namespace=\"$mirror\"" <(curl -fsS --max-time 5 "$ctl_url/metrics")

  stop_local "$api_pid"
  stop_local "$ctl_pid"
  expect_rule "local controller: SIGTERM stops it cleanly (exit $STOPPED_RC)" test "$STOPPED_RC" = 0
  expect_rule "local controller: it released the Lease on the way out" \
    output_is "" k -n "$NS" get lease "$lease" -o 'jsonpath={.spec.holderIdentity}'
  if ((${#FAILURES[@]} == failed_before)); then
    pass "the controller binary, as $NS/$sa with the chart's environment (RBAC, no admin), mirrored task $id as an open MeatspaceTask"
  fi
}

if $INSTALLED; then
  API_SA=meatspace-api-server
  check_controller_identity meatspace-controller "$NS" meatspace-controller no no
  check_controller_env meatspace-controller "$NS" meatspace-controller $((30 * 86400))
  log "8. the controller binary, run locally as the chart's controller"
  check_local_controller meatspace-controller "$NS" meatspace-controller

  # Every option on; the mirror moves to its own namespace. A StatefulSet's
  # volumeClaimTemplates are immutable, so the volume keeps its install-time
  # size and class (the dry run above checked the all-options ones).
  mapfile -t args < <(values_args all-options)
  if helm_ok "helm upgrade (all-options values)" upgrade "$RELEASE" "$CHART" -n "$NS" "${args[@]}" \
       --set postgresql.persistence.size=1Gi --set postgresql.persistence.storageClass=; then
    for obj in "servicemonitor.monitoring.coreos.com/meatspace-api-server" networkpolicy/meatspace-postgresql \
               ingress/meatspace-api-server serviceaccount/meatspace-reconciler; do
      k -n "$NS" get "$obj" >/dev/null 2>&1 || fail "upgrade: $obj does not exist"
    done
    k -n "$MIRROR_NS" get role/meatspace-controller-mirror >/dev/null 2>&1 \
      || fail "upgrade: the mirror Role is not in $MIRROR_NS"
    expect_rule "upgrade: the mirror Role is no longer in $NS" absent "$NS" role/meatspace-controller-mirror
    expect_rule "upgrade: the dev key is the one from the values" \
      test "$(secret_value meatspace dev-key)" = "msd_all-options-dev-key-0123456789"
    API_SA=meatspace-api
    check_controller_identity meatspace-reconciler "$MIRROR_NS" meatspace-controller-leader yes yes
    check_controller_env meatspace-reconciler "$MIRROR_NS" meatspace-controller-leader $((7 * 86400))
  fi

  if helm_ok "helm uninstall" uninstall "$RELEASE" -n "$NS" --timeout 2m; then
    INSTALLED=false
    failed_before=${#FAILURES[@]}
    k get crd "$CRD_NAME" >/dev/null 2>&1 || fail "uninstall: the CRD was deleted despite crds.keep=true"
    # What is left, as kubectl lists it; a kubectl that fails proves nothing.
    if left=$(k -n "$NS" get deployments,statefulsets,services,roles,rolebindings,serviceaccounts -o name 2>"$WORK/left.err"); then
      [[ -z $left ]] || fail "uninstall: objects remain in $NS: $(tr '\n' ' ' <<<"$left")"
    else
      fail "uninstall: listing what remains in $NS" "$WORK/left.err"
    fi
    if left=$(k -n "$MIRROR_NS" get roles,rolebindings -o name 2>"$WORK/left.err"); then
      [[ -z $left ]] || fail "uninstall: RBAC remains in $MIRROR_NS: $(tr '\n' ' ' <<<"$left")"
    else
      fail "uninstall: listing the RBAC left in $MIRROR_NS" "$WORK/left.err"
    fi
    k -n "$NS" get secret meatspace-postgresql >/dev/null 2>&1 \
      || fail "uninstall: the PostgreSQL password Secret was deleted despite retainOnUninstall"
    if ((${#FAILURES[@]} == failed_before)); then
      pass "uninstall removed the release and kept the CRD and the retained PostgreSQL Secret"
    fi
  fi
fi

# ---- result -------------------------------------------------------------------------
FINISHED=true
if ((${#FAILURES[@]})); then
  report
  exit 1
fi
log "PASS: every check passed"
