#!/usr/bin/env bash
# Build libortllm_ops.so (Release, -O3) into runtime/lib/ (or --out DIR).
#   ci/build_ops.sh           -> build/ops,      runtime/lib/libortllm_ops.so
#   ci/build_ops.sh --asan    -> build/ops-asan, runtime/lib/asan/libortllm_ops.so (-fsanitize=address)
# Headers come from ci/fetch_ort_headers.sh (never installed system-wide). Uses at most 2 jobs.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
asan=0
out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --asan) asan=1; shift ;;
        --out) out="$2"; shift 2 ;;
        *) echo "usage: ci/build_ops.sh [--asan] [--out DIR]" >&2; exit 2 ;;
    esac
done
include_dir="$("$repo_root/ci/fetch_ort_headers.sh")"
if [[ $asan == 1 ]]; then
    build="$repo_root/build/ops-asan"; out="${out:-$repo_root/runtime/lib/asan}"; asan_flag=ON
else
    build="$repo_root/build/ops"; out="${out:-$repo_root/runtime/lib}"; asan_flag=OFF
fi
cmake -S "$repo_root/custom_ops" -B "$build" -DCMAKE_BUILD_TYPE=Release \
      -DORT_INCLUDE_DIR="$include_dir" -DORTLLM_ASAN="$asan_flag" >/dev/null
cmake --build "$build" -j 2
mkdir -p "$out"
cp "$build/libortllm_ops.so" "$out/libortllm_ops.so.tmp"
mv "$out/libortllm_ops.so.tmp" "$out/libortllm_ops.so"   # atomic: a running process keeps its copy
echo "$out/libortllm_ops.so"
