#!/usr/bin/env bash
# openapi-check.sh — proves that GET /api/v1/openapi.json describes the API
# as it is, against the real server binary on SQLite:
#
#   1. openapi-spec-validator accepts the served document;
#   2. schemathesis fuzzes every operation with its checks (status codes,
#      content types, headers and bodies as documented, no 5xx, invalid
#      input and missing credentials refused, ...) and must report no
#      failure;
#   3. openapi-python-client generates a client from it, and
#      scripts/openapi/drive.py runs tasks through every operation with that
#      client, photos included.
#
#   scripts/openapi-check.sh
#
# Needs python3 with the venv module, curl, and the server binary built by
# `cargo build` (debug/meatspace-api-server in cargo's target directory:
# CARGO_TARGET_DIR or ./target; MEATSPACE_API_SERVER_BIN overrides). The Python tools are pinned
# and installed once into a virtualenv under ~/.cache/meatspace-tools.
# Everything it starts is stopped on exit; any failure exits non-zero.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$ROOT/scripts/openapi

# Pinned tool versions: a new release cannot change what CI accepts.
OPENAPI_SPEC_VALIDATOR=0.9.0
SCHEMATHESIS=4.32.5
OPENAPI_PYTHON_CLIENT=0.29.1
PILLOW=12.0.0 # drive.py makes its JPEG with it

# Generated cases per operation and phase; with these the step takes well
# under two minutes on two cores.
MAX_EXAMPLES=${MEATSPACE_OPENAPI_MAX_EXAMPLES:-50}

log() { printf '[openapi-check] %s\n' "$*" >&2; }
die() { printf '[openapi-check] ERROR: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is not installed (.ci/run installs it)"
command -v curl >/dev/null || die "curl is not installed"

if [[ -z ${MEATSPACE_API_SERVER_BIN:-} ]]; then
  # Where cargo puts the binaries: CARGO_TARGET_DIR, a cargo config, or ./target.
  command -v cargo >/dev/null || die "cargo is not installed"
  TARGET_DIR=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps --offline \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])') \
    || die "cargo metadata failed"
fi
BIN=${MEATSPACE_API_SERVER_BIN:-$TARGET_DIR/debug/meatspace-api-server}
[[ -x $BIN ]] || die "no server binary at $BIN (run cargo build --bins first)"

# ---- the pinned tools -----------------------------------------------------------
CACHE=${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}
VENV=$CACHE/openapi-venv-py$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')-osv$OPENAPI_SPEC_VALIDATOR-st$SCHEMATHESIS-opc$OPENAPI_PYTHON_CLIENT-pil$PILLOW
if [[ ! -f $VENV/.complete ]]; then
  # Built in place (a venv's scripts name their interpreter by path); the
  # marker is written last, so an interrupted install is redone.
  log "installing the pinned tools into $VENV"
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
  "$VENV/bin/pip" install --disable-pip-version-check --quiet \
    "openapi-spec-validator==$OPENAPI_SPEC_VALIDATOR" \
    "schemathesis==$SCHEMATHESIS" \
    "openapi-python-client==$OPENAPI_PYTHON_CLIENT" \
    "pillow==$PILLOW" || die "pip install of the pinned tools failed"
  touch "$VENV/.complete"
fi
PY=$VENV/bin/python
for tool in openapi-spec-validator schemathesis openapi-python-client; do
  [[ -x $VENV/bin/$tool ]] || die "$tool is missing from $VENV"
done

# ---- the server -----------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/meatspace-openapi.XXXXXX")
SERVER_PID=""
cleanup() {
  local rc=$?
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ $rc -ne 0 && -f $WORK/server.log ]]; then
    log "server log (last 40 lines):"
    tail -n 40 "$WORK/server.log" >&2 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

DEV_KEY=msd_openapi_check_$RANDOM$RANDOM
# Port 0: the kernel picks a free port, which the server logs. The fuzzer
# sends hundreds of requests with missing or forged credentials on purpose,
# all from 127.0.0.1: the per-address limit of failed authentications is off
# here, so that each of them gets the answer the document promises (401)
# instead of the lockout's 429 (api_edges tests the lockout).
env -u DATABASE_URL MEATSPACE_DATA_DIR="$WORK/data" MEATSPACE_DEV_KEY="$DEV_KEY" \
  MEATSPACE_AUTH_FAILURES_PER_MINUTE=0 \
  MEATSPACE_LISTEN_ADDR=127.0.0.1:0 MEATSPACE_METRICS_LISTEN_ADDR=127.0.0.1:0 MEATSPACE_LOG_FORMAT=json \
  "$BIN" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
ADDR=""
for _ in $(seq 300); do
  kill -0 "$SERVER_PID" 2>/dev/null || die "the server exited at start"
  ADDR=$(sed -n 's/.*"message":"listening","addr":"\([0-9.:]*\)".*/\1/p' "$WORK/server.log" | head -n 1)
  [[ -n $ADDR ]] && break
  sleep 0.1
done
[[ -n $ADDR ]] || die "the server did not log its address within 30 s"
BASE=http://$ADDR
for _ in $(seq 300); do
  curl -sf "$BASE/readyz" >/dev/null && break
  sleep 0.1
done
curl -sf "$BASE/readyz" >/dev/null || die "$BASE/readyz did not answer 200 within 30 s"
log "server ready on $BASE"

# ---- 1. the document is valid OpenAPI ---------------------------------------------
curl -sf "$BASE/api/v1/openapi.json" -o "$WORK/openapi.json" || die "GET /api/v1/openapi.json failed"
"$VENV/bin/openapi-spec-validator" "$WORK/openapi.json" || die "openapi-spec-validator rejects the document"

# Every event type has its own schema under the Event union (a oneOf
# discriminated on `type`), and its example validates against the union,
# matching exactly its own branch (jsonschema comes with schemathesis).
"$PY" - "$WORK/openapi.json" <<'PY' || die "the event schemas and their examples disagree"
import json, sys
from jsonschema import Draft202012Validator
doc = json.load(open(sys.argv[1]))
schemas = doc["components"]["schemas"]
# The document itself as the root schema, so "#/components/..." resolves
# (its other keys are not JSON Schema keywords and are ignored).
def validator(ref):
    return Draft202012Validator(dict(doc, **{"$ref": ref}))
union = schemas["Event"]
mapping = union["discriminator"]["mapping"]
names = set(schemas["EventType"]["enum"])
assert set(mapping) == names, f"event types without a schema: {names ^ set(mapping)}"
assert sorted(b["$ref"] for b in union["oneOf"]) == sorted(mapping.values())
for kind, ref in mapping.items():
    branch = schemas[ref.rsplit("/", 1)[-1]]
    example = branch["example"]
    assert example["type"] == kind, (kind, example)
    validator("#/components/schemas/Event").validate(example)
    for other_kind, other in mapping.items():
        ok = validator(other).is_valid(example)
        assert ok == (other_kind == kind), f"the {kind} example matches {other_kind}"
print(f"[openapi-check] {len(mapping)} event types, each example valid against its own schema only", file=sys.stderr)
PY

# ---- 2. schemathesis ----------------------------------------------------------------
# Calls the API and prints the JSON answer; fails on any other status.
api() {
  local method=$1 path=$2 auth=$3 status=$4
  shift 4
  local out code
  out=$(curl -s -o "$WORK/body" -w '%{http_code}' -X "$method" "$BASE$path" -H "$auth" "$@") \
    || die "$method $path: curl failed"
  code=$out
  [[ $code == "$status" ]] || die "$method $path: expected $status, got $code: $(head -c 500 "$WORK/body")"
  cat "$WORK/body"
}
field() { "$PY" -c 'import json, sys; v = json.load(sys.stdin)
for k in sys.argv[1].split("."): v = v[int(k)] if isinstance(v, list) else v[k]
print(v)' "$1"; }
json=(-H 'content-type: application/json')
dev="x-meatspace-dev-key: $DEV_KEY"

"$PY" -c 'import sys; from PIL import Image; Image.new("RGB", (16, 12), (200, 120, 40)).save(sys.argv[1], "JPEG")' \
  "$WORK/photo.jpg"

worker=$(api POST /api/v1/workers "$dev" 201 "${json[@]}" -d '{"name":"schemathesis"}')
WORKER_TOKEN=$(field worker_token <<<"$worker")
wauth="authorization: Bearer $WORKER_TOKEN"

# A task in the hands of the worker: created, published, claimed, started.
active_task() {
  local created id token
  created=$(api POST /api/v1/tasks "$dev" 201 "${json[@]}" -d "{\"description\":\"$1\"}")
  id=$(field task.id <<<"$created")
  token=$(field agent_token <<<"$created")
  api POST "/api/v1/tasks/$id/publish" "authorization: Bearer $token" 200 >/dev/null
  api POST "/api/v1/worker/tasks/$id/claim" "$wauth" 200 >/dev/null
  api POST "/api/v1/worker/tasks/$id/start" "$wauth" 200 >/dev/null
  printf '%s %s\n' "$id" "$token"
}
read -r AGENT_TASK_ID AGENT_TOKEN < <(active_task "agent operations under the fuzzer")
AGENT_PHOTO_ID=$(api POST "/api/v1/worker/tasks/$AGENT_TASK_ID/photos" "$wauth" 200 \
  -H 'content-type: image/jpeg' --data-binary "@$WORK/photo.jpg" | field events.0.data.photo_id)
AGENT_ISSUE_ID=$(api POST "/api/v1/worker/tasks/$AGENT_TASK_ID/issues" "$wauth" 200 "${json[@]}" \
  -d '{"kind":"other","text":"a question"}' | field events.0.id)
read -r WORKER_TASK_ID _ < <(active_task "worker operations under the fuzzer")
# An operator's API key (every scope), for the operations that take one.
API_KEY=$(api POST /api/v1/keys "$dev" 201 "${json[@]}" -d '{"name":"schemathesis","kind":"operator"}' \
  | field secret)
export DEV_KEY AGENT_TASK_ID AGENT_TOKEN AGENT_PHOTO_ID AGENT_ISSUE_ID WORKER_TOKEN WORKER_TASK_ID API_KEY

# Every check but positive_data_acceptance, which expects any schema-valid
# input to succeed: the document cannot say that a page cursor is opaque,
# that `text` is required for two of the three issue answers, or that
# integers are not written as 1.0.
# One worker thread: hypothesis parses a source file with `ast` to describe
# a lambda, and on CPython 3.11 two threads doing so at once fail at random
# with "AST constructor recursion depth mismatch" (a Runtime Error of the
# run, not a finding). One thread is no slower on two cores.
log "schemathesis: every operation, $MAX_EXAMPLES cases per phase, every check"
(
  cd "$WORK"
  "$VENV/bin/schemathesis" --config-file "$HERE/schemathesis.toml" run \
    "$WORK/openapi.json" --url "$BASE" \
    --phases examples,coverage,fuzzing \
    --checks all --exclude-checks positive_data_acceptance \
    --max-examples "$MAX_EXAMPLES" \
    --workers 1 \
    --request-timeout 20 \
    --no-color
) || die "schemathesis found responses that do not conform to the document"

# ---- 3. a generated client runs every operation ----------------------------------------
# openapi-python-client sends binary bodies only as application/octet-stream
# unless told which media types are binary; the photo upload is sent as JPEG.
cat >"$WORK/generator.yaml" <<'EOF'
content_type_overrides:
  image/jpeg: application/octet-stream
EOF
(
  cd "$WORK"
  "$VENV/bin/openapi-python-client" generate --path "$WORK/openapi.json" --meta none \
    --config "$WORK/generator.yaml" --output-path "$WORK/client/meatspace_client" >"$WORK/generate.log" 2>&1
) || { cat "$WORK/generate.log" >&2; die "openapi-python-client could not generate a client"; }
"$PY" "$HERE/drive.py" "$BASE" "$DEV_KEY" "$WORK/client" || die "the generated client failed (see above)"

log "OK: the document validates, conforms under fuzzing, and drives a generated client"
