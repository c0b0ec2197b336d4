#!/usr/bin/env bash
# `make test`: the whole suite on this CPU's best ops path, then the tests that depend on the ops' numerics
# (marker isa_paths: quality gates, batch invariance, speculative identity, ops parity) again on the AVX2 path
# (ORTLLM_OPS_ISA=avx2), unless the best path already is AVX2. Both runs share the artifacts they build
# (ORTLLM_TEST_ARTIFACTS, tests/conftest.py), so the second run builds nothing again.
# PYTEST_ARGS (environment): extra pytest arguments for both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
shared=$(mktemp -d "${TMPDIR:-/tmp}/ortllm-test-artifacts.XXXXXX")
trap 'rm -rf "$shared"' EXIT
export ORTLLM_TEST_ARTIFACTS="$shared"
best=$($PY -c 'from ortllm.runtime.ops_library import ops_isa; print(ops_isa())')
echo "== make test: the whole suite on the ops path ${best} (this CPU's best) =="
# shellcheck disable=SC2086
$PY -m pytest -q ${PYTEST_ARGS:-}
if [ "$best" != avx2 ]; then
  echo "== make test: the isa_paths tests again on the ops path avx2 (ORTLLM_OPS_ISA=avx2) =="
  # shellcheck disable=SC2086
  ORTLLM_OPS_ISA=avx2 $PY -m pytest -q -m isa_paths ${PYTEST_ARGS:-}
else
  echo "== make test: this CPU's best ops path is avx2: the isa_paths tests ran on it above =="
fi
