#!/usr/bin/env bash
# clang-format check of custom_ops/src against custom_ops/.clang-format (run by `make lint`).
# Usage: ci/clang_format_check.sh [--fix]   (--fix rewrites the files in place)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang-format >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-format >/dev/null; } || true
fi
command -v clang-format >/dev/null 2>&1 || { echo "clang-format is not installed (apt-get install clang-format)" >&2; exit 1; }

mapfile -t files < <(git ls-files 'custom_ops/src/*.h' 'custom_ops/src/*.cc')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format --style=file -i "${files[@]}"
  exit 0
fi
clang-format --style=file --dry-run --Werror "${files[@]}"
