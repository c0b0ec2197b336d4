#!/usr/bin/env bash
# Cross-build libortllm_ops.so for aarch64 (Debian's g++-aarch64-linux-gnu): the library's portable part (the ISA
# registry with the scalar row only: custom_ops/src/kernels/isa_generic.cc) must build for an architecture without
# x86's tables. Prints the built file's path; exit 0 when it built. Checks the build only (the library cannot run
# here). Used by tests/custom_ops/test_cross_build.py; installs the cross compiler if apt can.
#   ci/cross_build_aarch64.sh [BUILD_DIR]     (default build/ops-aarch64)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo_root/build/ops-aarch64}"
cxx=aarch64-linux-gnu-g++
if ! command -v "$cxx" >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu >/dev/null; } || true
fi
command -v "$cxx" >/dev/null 2>&1 || { echo "no $cxx (apt-get install g++-aarch64-linux-gnu)" >&2; exit 3; }
include_dir="$("$repo_root/ci/fetch_ort_headers.sh")"
cmake -S "$repo_root/custom_ops" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DORT_INCLUDE_DIR="$include_dir" \
      -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$build" -j 2 >/dev/null
echo "$build/libortllm_ops.so"
