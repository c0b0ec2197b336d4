#!/usr/bin/env bash
# Find ONNX Runtime C/C++ headers for building libortllm_ops.so and print their include dir.
#
# Order: $ORT_INCLUDE_DIR, /usr/include/onnxruntime, else a private cache holding the headers of
# Debian trixie's libonnxruntime-dev (API 21 -> the library loads in onnxruntime >= 1.21).
# The .deb is fetched with `apt-get download` using a private source list and private apt
# state/cache dirs and unpacked with `dpkg -x`: nothing is installed system-wide.
# Idempotent: a cache that already holds onnxruntime_c_api.h is reused.
#
# Usage: ci/fetch_ort_headers.sh            (prints the include dir on stdout, logs on stderr)
# Env:   ORT_INCLUDE_DIR    use these headers as is
#        ORT_HEADERS_CACHE  cache dir (default <repo>/.cache/ort-headers)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
header=onnxruntime_c_api.h

if [[ -n "${ORT_INCLUDE_DIR:-}" ]]; then
    if [[ -f "$ORT_INCLUDE_DIR/$header" ]]; then echo "$ORT_INCLUDE_DIR"; exit 0; fi
    echo "ORT_INCLUDE_DIR=$ORT_INCLUDE_DIR has no $header" >&2; exit 1
fi
if [[ -f /usr/include/onnxruntime/$header ]]; then echo /usr/include/onnxruntime; exit 0; fi

cache="${ORT_HEADERS_CACHE:-$repo_root/.cache/ort-headers}"
include="$cache/include/onnxruntime"
if [[ -f "$include/$header" ]]; then echo "$include"; exit 0; fi

work="$cache/.apt"
rm -rf "$work"
mkdir -p "$work/etc/sources.list.d" "$work/etc/preferences.d" "$work/state/lists/partial" \
         "$work/cache/archives/partial" "$work/deb" "$work/root"
echo "deb http://deb.debian.org/debian trixie main" > "$work/etc/sources.list"
apt_opts=(
    -o "Dir::Etc::sourcelist=$work/etc/sources.list"
    -o "Dir::Etc::sourceparts=-"
    -o "Dir::Etc::preferencesparts=$work/etc/preferences.d"
    -o "Dir::State=$work/state"
    -o "Dir::State::status=$work/state/status"
    -o "Dir::Cache=$work/cache"
    -o "APT::Get::List-Cleanup=0"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
)
touch "$work/state/status"
echo "fetching libonnxruntime-dev (Debian trixie) headers into $cache" >&2
apt-get "${apt_opts[@]}" update >&2
(cd "$work/deb" && apt-get "${apt_opts[@]}" download libonnxruntime-dev >&2)
deb="$(ls "$work"/deb/libonnxruntime-dev_*.deb | head -n1)"
dpkg -x "$deb" "$work/root"
found="$(dirname "$(find "$work/root" -name "$header" | head -n1)")"
[[ -f "$found/$header" ]] || { echo "no $header in $deb" >&2; exit 1; }
mkdir -p "$cache/include"
rm -rf "$include"
cp -r "$found" "$include"
basename "$deb" > "$cache/SOURCE"
rm -rf "$work"
echo "$include"
