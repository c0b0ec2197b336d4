#!/usr/bin/env bash
# `make image-test`: build the Containerfile with podman, run it, wait for /health, answer one chat request through
# the stock `openai` client, print the image's size and the time to the first answer, then stop and remove the
# container and its volume (whatever happens).
#
# This machine's workarounds live here, never in the Containerfile (`docker build .` must work as it is elsewhere):
#   - podman (Debian's podman, runc, mmdebstrap; apt-get installed when missing) runs as
#     `podman --runtime runc --cgroup-manager cgroupfs` with --network host and a containers.conf whose
#     default_ulimits is empty;
#   - no image registry is reachable: when no debian:bookworm-slim image is present, one is made from Debian's
#     archive (`mmdebstrap --variant=minbase bookworm`, with the docs/man/locale excludes of Docker's -slim images)
#     and `podman import`ed under that name, so the Containerfile's FROM resolves locally;
#   - pip reaches PyPI through a TLS proxy: the host's pip CA bundle (PIP_CERT / pip's global.cert), when it has
#     one, is bind-mounted into the build with a pip.conf naming it (nothing of it stays in the image).
#
# Usage: ci/image_test.sh                       env: IMAGE (default ortllm:test), PYTHON (a python with `openai`,
#                                                    default .venv/bin/python), HEALTH_TIMEOUT (s, default 300)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
image="${IMAGE:-ortllm:test}"
python="${PYTHON:-$repo_root/.venv/bin/python}"
health_timeout="${HEALTH_TIMEOUT:-300}"
work="$repo_root/build/image-test"     # the base rootfs tar (reused), containers.conf, pip.conf (in .dockerignore)
mkdir -p "$work"

"$python" -c "import openai" 2>/dev/null || { echo "image-test: $python has no openai client (make setup)" >&2; exit 1; }

# ---- podman
missing=()
for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
    echo "image-test: installing ${missing[*]} (apt-get)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
fi
printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"
podman=(podman --runtime runc --cgroup-manager cgroupfs)

# ---- the base image
if ! "${podman[@]}" image exists debian:bookworm-slim; then
    rootfs="$work/bookworm-minbase.tar"
    if [[ ! -s "$rootfs" ]]; then
        echo "image-test: no debian:bookworm-slim image; making one with mmdebstrap (Debian's archive)" >&2
        mmdebstrap --variant=minbase --quiet \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
            --dpkgopt='path-exclude=/usr/share/groff/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
            bookworm "$work/partial.tar"       # the format follows the name: .tar
        mv "$work/partial.tar" "$rootfs"
    fi
    "${podman[@]}" import "$rootfs" debian:bookworm-slim >/dev/null
fi

# ---- build (docker format: OCI image metadata has no HEALTHCHECK)
build_mounts=()
host_ca="${PIP_CERT:-$("$python" -m pip config get global.cert 2>/dev/null || true)}"
if [[ -n "$host_ca" && -f "$host_ca" ]]; then
    printf '[global]\ncert = /etc/ssl/host-pip-ca.crt\n' > "$work/pip.conf"
    build_mounts=(-v "$host_ca:/etc/ssl/host-pip-ca.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro")
fi
t0=$(date +%s)
"${podman[@]}" build --format docker --pull=never --network host "${build_mounts[@]}" -t "$image" -f Containerfile .
build_s=$(( $(date +%s) - t0 ))

# ---- run
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
name="ortllm-image-test-$$"
cleanup() {
    "${podman[@]}" rm -f -t 10 "$name" >/dev/null 2>&1 || true
    "${podman[@]}" volume rm -f "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM          # through the EXIT trap: the container goes whatever ends the script
start=$("$python" -c 'import time; print(time.time())')
# The image's defaults as a user gets them (the baked model, ORTLLM_HOME on a named volume), on 127.0.0.1:$port.
"${podman[@]}" run -d --name "$name" --network host -v "$name:/var/lib/ortllm" \
    -e ORTLLM_HOST=127.0.0.1 -e ORTLLM_PORT="$port" "$image" >/dev/null

"$python" - "$port" "$start" "$health_timeout" "$name" <<'EOF'
import json, subprocess, sys, time, urllib.error, urllib.request

port, start, timeout, name = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + timeout
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            health = json.load(r)
            break
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        state = subprocess.run(["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "inspect", "-f",
                                "{{.State.Status}}", name], capture_output=True, text=True).stdout.strip()
        if state not in ("running", "created", "configured"):
            sys.exit(f"image-test: the container is {state or 'gone'} before /health answered 200 ({e})")
        if time.monotonic() > deadline:
            sys.exit(f"image-test: /health did not answer 200 within {timeout:.0f} s ({e})")
        time.sleep(0.5)
healthy = time.time() - start

from openai import OpenAI

client = OpenAI(base_url=base + "/v1", api_key="unused")
reply = client.chat.completions.create(model=health["model"], max_tokens=16, temperature=0,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
answered = time.time() - start
text = reply.choices[0].message.content
if not text or not text.strip():
    sys.exit(f"image-test: empty answer: {reply}")
print(f"model: {health['model']}")
print(f"answer: {text!r} ({reply.usage.completion_tokens} tokens)")
print(f"healthy after {healthy:.1f} s; first answer after {answered:.1f} s (from `podman run`)")
EOF

# What the Containerfile promises, checked in the running container: non-root, no torch, the HEALTHCHECK passes.
# (podman logs "unable to get systemd connection" for the check's timer here, a machine without systemd:
# `podman healthcheck run` runs the image's HEALTHCHECK command itself.)
uid="$("${podman[@]}" exec "$name" id -u)"
[[ "$uid" != 0 ]] || { echo "image-test: the server runs as root" >&2; exit 1; }
"${podman[@]}" exec "$name" python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)" \
    || { echo "image-test: torch is installed in the image" >&2; exit 1; }
"${podman[@]}" healthcheck run "$name" >/dev/null \
    || { echo "image-test: the image's HEALTHCHECK fails against a serving container" >&2; exit 1; }
size="$("${podman[@]}" image inspect "$image" --format '{{.Size}}')"
echo "uid in the container: $uid; torch: absent; HEALTHCHECK: healthy"
echo "image $image: $(( size / 1000000 )) MB ($size bytes; built in ${build_s} s)"
"${podman[@]}" stop -t 30 "$name" >/dev/null
echo "image-test: ok"
