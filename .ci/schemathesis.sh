#!/usr/bin/env bash
# Fuzzes the HTTP API against the OpenAPI spec it serves, with schemathesis (see
# docs/reliability.md, "API fuzzing").
#
# Starts a real `permit serve` (the binary built from this checkout) on an ephemeral loopback
# port with a temporary data dir, runs schemathesis against `/v1/openapi.json` with the checks
# below, then kills the server by its PID. Fails on any 5xx, any response the spec does not
# document (status, content type, body schema, headers), and any panic in the server's log.
#
# Environment:
#   SCHEMATHESIS             the schemathesis executable (default: .ci/venv/bin/schemathesis)
#   PERMIT_BIN               the server binary (default: `cargo build -p permit`, then
#                            target/debug/permit)
#   PERMIT_FUZZ_SERVE_ARGS   extra `permit serve` flags, split on spaces (e.g. "--auth ...")
#   PERMIT_FUZZ_AUTH_TOKEN   if set, every request carries `Authorization: Bearer TOKEN`
#   PERMIT_FUZZ_MAX_EXAMPLES test cases per operation and phase (default 100)
#   PERMIT_FUZZ_SEED         hypothesis seed (default: random; the report prints it)
#   PERMIT_FUZZ_ARGS         extra schemathesis `run` flags, split on spaces
#                            (e.g. "--include-path-regex ^/v1/sessions")
#   PERMIT_FUZZ_REPORT_DIR   where to keep the server log and schemathesis' reports on failure
set -euo pipefail
cd "$(dirname "$0")/.."

schemathesis=${SCHEMATHESIS:-.ci/venv/bin/schemathesis}
bin=${PERMIT_BIN:-}
max_examples=${PERMIT_FUZZ_MAX_EXAMPLES:-100}
report_dir=${PERMIT_FUZZ_REPORT_DIR:-target/schemathesis}
# How long the server may take to print its address and to elect itself.
start_deadline_s=30

if [ -z "$bin" ]; then
  cargo build -p permit --locked
  bin=target/debug/permit
fi
mkdir -p "$report_dir"

work=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

: >"$work/stdout"
# shellcheck disable=SC2086 # PERMIT_FUZZ_SERVE_ARGS is a list of flags on purpose.
"$bin" serve --listen 127.0.0.1:0 --data-dir "$work/data" ${PERMIT_FUZZ_SERVE_ARGS:-} \
  >"$work/stdout" 2>"$work/server.log" &
server_pid=$!

# Whether GET /v1/health answers 200 (python3 is needed for schemathesis anyway; curl may be absent).
healthy() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
    "http://$1/v1/health" 2>/dev/null
}

# Polls until the server printed its address and answers healthy, or the deadline passes.
addr=""
deadline=$((SECONDS + start_deadline_s))
while [ "$SECONDS" -lt "$deadline" ]; do
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; echo "schemathesis: server exited"; exit 1; }
  if [ -z "$addr" ]; then
    addr=$(sed -n 's/^permit listening on http:\/\/\([^ ]*\).*/\1/p' "$work/stdout" | head -n 1 || true)
  fi
  if [ -n "$addr" ] && healthy "$addr"; then
    break
  fi
  sleep 0.1
done
if [ -z "$addr" ] || ! healthy "$addr"; then
  cat "$work/server.log"
  echo "schemathesis: the server did not become healthy within ${start_deadline_s}s"
  exit 1
fi
echo "schemathesis: permit serve (pid $server_pid) on http://$addr ${PERMIT_FUZZ_SERVE_ARGS:-}"

args=(
  --config-file .ci/schemathesis.toml
  run "http://$addr/v1/openapi.json"
  --url "http://$addr"
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance,negative_data_rejection,unsupported_method
  --phases examples,coverage,fuzzing,stateful
  --max-examples "$max_examples"
  --workers 1
  --request-timeout 10
  --no-color
  --output-sanitize false
  --suppress-health-check all
  --generation-database none
  --report junit --report-dir "$report_dir"
)
# shellcheck disable=SC2206 # PERMIT_FUZZ_ARGS is a list of flags on purpose.
[ -n "${PERMIT_FUZZ_ARGS:-}" ] && args+=(${PERMIT_FUZZ_ARGS})
[ -n "${PERMIT_FUZZ_SEED:-}" ] && args+=(--seed "$PERMIT_FUZZ_SEED")
[ -n "${PERMIT_FUZZ_AUTH_TOKEN:-}" ] && args+=(-H "Authorization: Bearer $PERMIT_FUZZ_AUTH_TOKEN")

started=$SECONDS
status=0
"$schemathesis" "${args[@]}" || status=$?
echo "schemathesis: finished in $((SECONDS - started))s with exit code $status"

if grep -q 'panicked' "$work/server.log"; then
  echo "schemathesis: the server panicked:"
  grep -A5 'panicked' "$work/server.log"
  status=1
fi
if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "schemathesis: the server died during the run"
  status=1
fi
if [ "$status" != 0 ]; then
  cp "$work/server.log" "$report_dir/server.log"
  echo "schemathesis: server log and reports kept in $report_dir"
fi
exit "$status"
