#!/usr/bin/env bash
# The API document as the contract: schemathesis with every check over /openapi.json, several random seeds, 25
# examples an operation, against `ortllm serve` on the tiny test model (a key-less loopback server with its own
# store). positive_data_acceptance is tests/service/contract_checks.py's variant, which lets through only the 400s
# no schema can state (it lists them). Minutes per seed; never part of make test (its short run:
# tests/service/test_http_errors.py).
#   ci/schemathesis_contract.sh [SEED...]      (default seeds 1 2 3; ARTIFACT=DIR serves another engine artifact)
#   KEY=1 ci/schemathesis_contract.sh [SEED...] the server with an API key (ORTLLM_API_KEY), each seed twice:
#                                              schemathesis sending the key (the whole API), then without it (every
#                                              route but the public ones must answer 401 as documented)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ST=${ST:-$(dirname "$PY")/schemathesis}
[[ $PY = /* ]] || PY=$PWD/$PY          # absolute (schemathesis runs in the work directory), venv kept
[[ $ST = /* ]] || ST=$PWD/$ST
seeds=("${@:-1 2 3}")
work=$(mktemp -d "${TMPDIR:-/tmp}/ortllm-contract.XXXXXX")
server=
cleanup() { if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; rm -rf "$work"; }
trap cleanup EXIT
art=${ARTIFACT:-$work/tiny}
[ -f "$art/manifest.json" ] || $PY -m ortllm build llama-tiny-random --out "$art" >/dev/null
start_server() {     # a fresh one-model server and store per seed (a pull would make it serve several models,
                     # whose per-model limits the document does not carry)
  if [ -n "$server" ]; then kill "$server"; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work/home"
  ORTLLM_HOME=$work/home ORTLLM_API_KEY=${key:-} $PY -m ortllm serve "$art" --host 127.0.0.1 --port 0 \
    > "$work/serve.log" 2>&1 &
  server=$!
  url=
  for _ in $(seq 120); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" | head -1 || true)
    [ -n "$url" ] && break
    sleep 1
  done
  [ -n "$url" ] || { cat "$work/serve.log"; exit 1; }
}
failed=0
repo=$PWD
key=
[ "${KEY:-0}" = 1 ] && key=contract-$RANDOM$RANDOM
modes=(none)
[ -n "$key" ] && modes=(sent withheld)
for seed in ${seeds[*]}; do
  for mode in "${modes[@]}"; do
    start_server
    auth=()
    [ "$mode" = sent ] && auth=(-H "Authorization: Bearer $key")
    echo "== schemathesis, seed $seed, key: $mode, against $url =="
    # in the work directory: schemathesis keeps a crash cache in its cwd (.schemathesis/) and replays it
    (cd "$work" && PYTHONPATH=$repo SCHEMATHESIS_HOOKS=tests.service.contract_checks $ST run "$url/openapi.json" \
      --checks all --exclude-checks positive_data_acceptance -n 25 --seed "$seed" --request-timeout 120 \
      --output-truncate false --no-color "${auth[@]}") || failed=1
  done
done
exit $failed
