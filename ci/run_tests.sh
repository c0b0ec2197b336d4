#!/usr/bin/env bash
# `make test`: the whole suite on this CPU's best ops path, and the tests that depend on the ops' numerics
# (marker isa_paths: quality gates, batch invariance, speculative identity, ops parity) again on the AVX2 path
# (ORTLLM_OPS_ISA=avx2), unless the best path already is AVX2. Both runs share the artifacts they build
# (ORTLLM_TEST_ARTIFACTS, tests/conftest.py): the first builds them, the second never builds one again.
# The two runs go side by side: the suite keeps two cores busy only ~60% of the time (servers, subprocesses,
# Python between model runs), so the AVX2 run, at a lower priority (nice), fills the idle share; it waits for
# each artifact the first run builds (ORTLLM_TEST_ARTIFACTS_WAIT=1) and prints its log when the first has ended.
# PYTEST_ARGS (environment): extra pytest arguments for both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
shared=$(mktemp -d "${TMPDIR:-/tmp}/ortllm-test-artifacts.XXXXXX")
second_pid=
cleanup() {
  if [ -n "$second_pid" ]; then kill -- "$second_pid" 2>/dev/null || true; fi
  rm -rf "$shared"
}
trap cleanup EXIT
export ORTLLM_TEST_ARTIFACTS="$shared"
best=$($PY -c 'from ortllm.runtime.ops_library import ops_isa; print(ops_isa())')
start=$SECONDS

if [ "$best" != avx2 ]; then
  # shellcheck disable=SC2086
  ORTLLM_OPS_ISA=avx2 ORTLLM_TEST_ARTIFACTS_WAIT=1 nice -n 10 $PY -m pytest -q -m isa_paths ${PYTEST_ARGS:-} \
    > "$shared/avx2.log" 2>&1 &
  second_pid=$!
fi

echo "== make test: the whole suite on the ops path ${best} (this CPU's best) =="
first=0
# shellcheck disable=SC2086
$PY -m pytest -q ${PYTEST_ARGS:-} || first=$?
touch "$shared/builder-done"
echo "== the whole suite on ${best}: exit ${first} after $((SECONDS - start)) s =="

second=0
if [ -n "$second_pid" ]; then
  wait "$second_pid" || second=$?
  second_pid=
  echo "== make test: the isa_paths tests again on the ops path avx2 (ORTLLM_OPS_ISA=avx2), run beside the first =="
  cat "$shared/avx2.log"
  echo "== the isa_paths tests on avx2: exit ${second} after $((SECONDS - start)) s from the start =="
else
  echo "== make test: this CPU's best ops path is avx2: the isa_paths tests ran on it above =="
fi
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
