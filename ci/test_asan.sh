#!/usr/bin/env bash
# Build the AddressSanitizer variant of libortllm_ops.so and run the custom-op tests against it.
# Any out-of-bounds access in the ops aborts the run (non-zero exit).
# (test_hadamard_error.py is pure NumPy/torch and is skipped here: torch under an ASan preload is slow.)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
ci/build_ops.sh --asan >/dev/null
export ORTLLM_OPS_LIBRARY="$repo_root/runtime/lib/asan/libortllm_ops.so"
# libstdc++ is preloaded with libasan: python itself does not link it, and ASan's __cxa_throw
# interceptor must find the real one at start-up ("CHECK failed ... real___cxa_throw") or the first C++
# exception (ORT turning an op error into a Python exception) aborts the run.
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export LD_PRELOAD
export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
python="${PYTHON:-$repo_root/.venv/bin/python}"
exec "$python" -m pytest tests/custom_ops -q -p no:cacheprovider \
    --ignore tests/custom_ops/test_hadamard_error.py "$@"
