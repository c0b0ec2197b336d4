#!/usr/bin/env bash
# `make test`: the whole suite on this CPU's best ops path, and the tests that depend on the ops' numerics
# (marker isa_paths: quality gates, batch invariance, speculative identity, ops parity) again on the AVX2 path
# (ORTLLM_OPS_ISA=avx2), unless the best path already is AVX2. Both share the artifacts the first builds
# (ORTLLM_TEST_ARTIFACTS, tests/conftest.py): the second never builds one again.
# Each run goes package by package, one pytest process each (TEST_GROUPS): a single process over the whole suite grew
# to 18 GB of session state (models, tokenizers, torch) by the runtime tests and was killed for memory on this
# 24 GiB machine with the AVX2 run beside it; a process per package starts each group clean. The runtime tests
# still peak at 16 GB for a moment (tests/runtime/test_gemma3_invariance.py: Gemma 3's 262k head, fp32 and int8
# engines), the pipeline tests near 8 GB, the others under 6. So the AVX2 run, at a lower priority (nice), starts
# once the first run is past its runtime tests, and goes beside the first run's last groups (custom ops, service,
# CLI: the suite keeps two cores busy only part of the time there); it waits for each artifact the first run builds
# (ORTLLM_TEST_ARTIFACTS_WAIT=1) and its log is printed when both have ended.
# PYTEST_ARGS (environment): extra pytest arguments for every run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
shared=$(mktemp -d "${TMPDIR:-/tmp}/ortllm-test-artifacts.XXXXXX")
second_pid=
cleanup() {
  if [ -n "$second_pid" ]; then kill -- "-$second_pid" 2>/dev/null || true; fi   # its process group
  rm -rf "$shared"
}
trap cleanup EXIT
export ORTLLM_TEST_ARTIFACTS="$shared"
best=$($PY -c 'from ortllm.runtime.ops_library import ops_isa; print(ops_isa())')
start=$SECONDS
TEST_GROUPS=("tests/pipeline" "tests/calibration tests/batch" "tests/runtime" "tests/custom_ops"
        "tests/service tests/protocol" "tests/cli $(ls tests/test_*.py | tr '\n' ' ')")

# run_groups LABEL [pytest args...]: every group in its own process; the exit status of the first that failed
run_groups() {
  local label=$1 rc=0 g first; shift
  for g in "${TEST_GROUPS[@]}"; do
    echo "== ${label}: ${g} =="
    # shellcheck disable=SC2086
    $PY -m pytest -q "$@" ${PYTEST_ARGS:-} $g || { c=$?; [ "$c" -eq 5 ] || { [ "$rc" -ne 0 ] || rc=$c; }; }
    first=${g%% *}
    touch "$ORTLLM_TEST_ARTIFACTS/${label}-done-${first//\//_}"       # e.g. avx512vnni-done-tests_runtime
  done
  return "$rc"
}

if [ "$best" != avx2 ]; then
  # shellcheck disable=SC2016
  ORTLLM_OPS_ISA=avx2 ORTLLM_TEST_ARTIFACTS_WAIT=1 setsid nice -n 10 bash -c "$(declare -p TEST_GROUPS PY); \
    $(declare -f run_groups); \
    until [ -e '$shared/${best}-done-tests_runtime' ] || [ -e '$shared/builder-done' ]; do sleep 5; done; \
    run_groups avx2 -m isa_paths" > "$shared/avx2.log" 2>&1 &
  second_pid=$!
fi

echo "== make test: the whole suite on the ops path ${best} (this CPU's best) =="
first=0
run_groups "${best}" || first=$?
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
