#!/usr/bin/env bash
# `make quality`: the held-out quality table of docs/quality.md. Builds SmolLM2-135M-Instruct with every build
# option the table shows (skipping builds already in OUT), then scores them all against the fp32 build with
# `ortllm eval --suite fidelity` on held-out text (prose, code, chat: calibration/heldout.py), once on this CPU's
# best ops path and once with ORTLLM_OPS_ISA=avx2. Tables: OUT/<path>/summary.md; reports: OUT/<path>/<build>/.
# Minutes on 2 cores; never part of `make test`. QUALITY_TOKENS / QUALITY_CTX set the size (default 16384 / 2048).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-quality-results}
TOKENS=${QUALITY_TOKENS:-16384}
CTX=${QUALITY_CTX:-2048}
ORTLLM=.venv/bin/ortllm
MODEL=smollm2-135m-instruct
mkdir -p "$OUT/art"
declare -A BUILDS=(
  [fp32]="--quant fp32 --kv fp32"
  [int8]="--quant int8"
  [int4]="--quant int4"
  [int4-head4]="--quant int4 --lm-head int4"
  [int4-kv-fp32]="--quant int4 --kv fp32"
  [int4-kv-fp8]="--quant int4 --kv fp8"
  [int4-b64]="--quant int4 --block-size 64"
  [int4-b128]="--quant int4 --block-size 128"
  [kv-int8]="--kv int8"
  [kv-fp8]="--kv fp8"
)
ORDER=(int8 int4 int4-head4 int4-kv-fp32 int4-kv-fp8 int4-b64 int4-b128 kv-int8 kv-fp8)
for name in fp32 "${ORDER[@]}"; do
  [ -f "$OUT/art/$name/manifest.json" ] && continue
  echo "quality_table: building $name (${BUILDS[$name]})"
  # shellcheck disable=SC2086
  $ORTLLM build "$MODEL" ${BUILDS[$name]} --out "$OUT/art/$name" --force
done
arts=()
for name in "${ORDER[@]}"; do arts+=("$OUT/art/$name"); done
best=$(.venv/bin/python -c 'from ortllm.runtime.ops_library import ops_isa; print(ops_isa())')
for isa in "$best" avx2; do
  [ "$isa" = avx2 ] && [ "$best" = avx2 ] && [ -f "$OUT/avx2/summary.md" ] && continue
  echo "quality_table: scoring on the ops path $isa"
  ORTLLM_OPS_ISA=$isa $ORTLLM eval "${arts[@]}" --reference "$OUT/art/fp32" --suite fidelity \
    --tokens "$TOKENS" --ctx "$CTX" --out "$OUT/$isa" > /dev/null
  echo "quality_table: $OUT/$isa/summary.md"
done
