#!/usr/bin/env bash
# `make bench-8b`: Llama 3.1 8B's shapes (recipe llama-3.1-8b-shape: seeded random weights, speed and memory only)
# built by the streaming int4 build on this machine, and benched against llama.cpp Q4_0 and Q8_0 of the same weights.
# About an hour and ~45 GB of disk on 2 cores; never part of make test. Steps, each skipped when its output exists:
#   1. the recipe's fp16 safetensors directory (16 GB; $ORTLLM_HOME/shapes/, pipeline/shape_weights.py)
#   2. `ortllm build llama-3.1-8b-shape --quant int4` under /usr/bin/time -v (peak RSS, wall) -> $OUT/build-int4.time
#      (BENCH_8B_INT8=1: the int8 build too, `--smooth 0`: SmoothQuant's calibration needs an fp32 forward of the
#      whole model, 32 GB)
#   3. llama.cpp's GGUFs: an F16 GGUF written from the fp16 shards tensor by tensor (bench/peers/gguf_export.py; no
#      fp32 file of the model ever), llama.cpp's quantizer to Q4_0 and Q8_0, the F16 file deleted
#   4. this machine's read bandwidth on 1 and 2 threads (bench/probes/read_bandwidth.cc) -> $OUT/read-bandwidth.txt
#   5. `ortllm bench ART --scenario decode,prefill,long-context --peers llama.cpp-q4_0,llama.cpp-q8_0 --batches
#      BENCH_8B_BATCHES (1,16) --repeats 1` -> $OUT/peers (results.json, report.md)
# Needs .venv (make setup) and .venv-peers with llama_cpp and gguf (make bench-peers PEERS_ONLY=llama.cpp).
# Environment: BENCH_8B_RECIPE (llama-3.1-8b-shape; llama-3.2-3b-shape for 3B), BENCH_8B_OUT (bench-results/8b),
# BENCH_8B_ART (artifacts/RECIPE-int4), BENCH_8B_STEPS
# ("shape build gguf bandwidth bench"), BENCH_8B_BATCHES (1,16).
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${BENCH_8B_RECIPE:-llama-3.1-8b-shape}
OUT=${BENCH_8B_OUT:-bench-results/8b}
ART=${BENCH_8B_ART:-artifacts/$RECIPE-int4}
STEPS=${BENCH_8B_STEPS:-"shape build gguf bandwidth bench"}
BATCHES=${BENCH_8B_BATCHES:-1,16}
PEERS=${ORTLLM_PEERS_VENV:-.venv-peers}
ASSETS=${ORTLLM_PEERS_ASSETS:-$PEERS/models/$RECIPE}
want() { [[ " $STEPS " == *" $1 "* ]]; }
say() { echo "bench_8b: $*"; }
mkdir -p "$OUT" "$ASSETS"

# the fp16 directory: generated on first use by the build too; made here first so the build's time is its own
SHAPE=$(.venv/bin/python -c "
from ortllm.pipeline.recipes import get_recipe
from ortllm.pipeline.shape_weights import shape_dir
print(shape_dir(get_recipe('$RECIPE')))" | tail -n 1)
say "fp16 weights: $SHAPE ($(du -sh "$SHAPE" | cut -f1))"

build() {   # QUANT DIR [options]
  local quant=$1 dir=$2; shift 2
  [ -f "$dir/manifest.json" ] && { say "$dir exists: not built again"; return 0; }
  say "building $RECIPE --quant $quant -> $dir (peak RSS and wall: $OUT/build-$quant.time)"
  /usr/bin/time -v -o "$OUT/build-$quant.time" .venv/bin/ortllm build "$RECIPE" --quant "$quant" "$@" \
      --out "$dir" --force
  grep -E "Maximum resident|Elapsed" "$OUT/build-$quant.time"
  du -sh "$dir"
}
if want build; then
  build int4 "$ART"
  [ "${BENCH_8B_INT8:-0}" = 1 ] && build int8 "${ART%-int4}-int8" --smooth 0
fi

quant() {   # TYPE: model-TYPE.gguf from the F16 GGUF
  local type=$1 out="$ASSETS/model-$1.gguf"
  [ -f "$out" ] && return 0
  say "llama.cpp's quantizer: F16 -> ${type^^} ($out)"
  "$PEERS/bin/python" bench/peers/gguf_export.py --quantize "$ASSETS/model-f16.gguf" "$out.tmp" --type "$type" \
      > "$ASSETS/gguf-$type-quantize.log" 2>&1 || { rm -f "$out.tmp"; tail -n 5 "$ASSETS/gguf-$type-quantize.log"; exit 1; }
  mv "$out.tmp" "$out"
}
if want gguf && { [ ! -f "$ASSETS/model-q4_0.gguf" ] || [ ! -f "$ASSETS/model-q8_0.gguf" ]; }; then
  "$PEERS/bin/python" -c "import llama_cpp, gguf" 2>/dev/null \
    || { echo "bench_8b: $PEERS lacks llama_cpp or gguf: make bench-peers PEERS_ONLY=llama.cpp" >&2; exit 1; }
  [ -f "$ART/tokenizer.json" ] || { echo "bench_8b: $ART has no tokenizer.json: run the build step first" >&2; exit 1; }
  if [ ! -f "$ASSETS/model-f16.gguf" ]; then
    say "writing $ASSETS/model-f16.gguf from $SHAPE (tensor by tensor; peak RSS: $OUT/gguf-f16.time)"
    /usr/bin/time -v -o "$OUT/gguf-f16.time" "$PEERS/bin/python" bench/peers/gguf_export.py "$SHAPE" \
        "$ASSETS/model-f16.gguf.tmp" --type f16 --tokenizer "$ART" --name "$RECIPE"
    mv "$ASSETS/model-f16.gguf.tmp" "$ASSETS/model-f16.gguf"
  fi
  quant q4_0
  quant q8_0
  rm -f "$ASSETS/model-f16.gguf"
fi

if want bandwidth; then
  g++ -O2 -mavx2 -pthread bench/probes/read_bandwidth.cc -o "$OUT/read_bandwidth"
  { "$OUT/read_bandwidth" 1; "$OUT/read_bandwidth" 2; } | tee "$OUT/read-bandwidth.txt"
fi

if want bench; then
  say "ortllm bench $ART against llama.cpp Q4_0 and Q8_0 (batches $BATCHES; tens of minutes)"
  .venv/bin/ortllm bench "$ART" --scenario decode,prefill,long-context --peers llama.cpp-q4_0,llama.cpp-q8_0 \
      --batches "$BATCHES" --repeats 1 --out "$OUT/peers"
fi
