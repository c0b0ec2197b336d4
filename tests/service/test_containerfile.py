"""The Containerfile's promises, checked on the file (the real build and run: `make image-test`, ci/image_test.sh):
the image installs the base install only (no torch, no build or convert extra, no compiler), runs as a non-root
user, exposes the serve default port, keeps ORTLLM_HOME on a volume, serves through `ortllm serve`, and its
HEALTHCHECK command asks /health (run here against a live server, and against a closed port)."""
from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys

from ortllm.service.config import ServiceConfig
from tests.service.containerfile import global_args, health_path, healthcheck_argv, image, stages, user_ids

BUILD_ONLY = ("torch", "transformers", "onnxruntime-extensions", "onnxruntime_extensions", "gguf", "optimum",
              "peft", "accelerate")
COMPILERS = ("cmake", "g++", "gcc", "make", "clang", "build-essential")


def pip_installs(stage) -> list[list[str]]:
    """The arguments of every `pip install` in a stage's RUN lines (one list per command)."""
    out = []
    for run in stage.all("RUN"):
        for command in re.split(r"&&|;|\|\|", run.args):
            words = shlex.split(command)
            for k, word in enumerate(words):
                if word == "install" and k and words[k - 1].endswith("pip"):
                    out.append(words[k + 1:])
    return out


def test_two_stages_on_debian_slim():
    s = stages()
    assert [st.base for st in s] == ["debian:bookworm-slim"] * 2
    assert s[0].name, "the build stage has a name the image copies from"
    copies = [i.args for i in image().all("COPY")]
    assert all(c.startswith(f"--from={s[0].name} ") for c in copies), copies


def test_no_torch_and_no_build_extra_anywhere():
    for stage in stages():
        for run in stage.all("RUN"):
            assert "torch" not in run.args, f"a RUN mentions torch: {run.args}"
            assert not re.search(r"\[[^\]]*\bbuild\b", run.args), f"a RUN installs the build extra: {run.args}"
        for args in pip_installs(stage):
            for word in args:
                name = re.split(r"[\[=<>~!]", os.path.basename(word))[0].lower()
                assert name not in ("torch", "optimum-onnx", "peft", "accelerate"), args


def test_image_has_the_base_install_only():
    installs = pip_installs(image())
    assert installs, "the image stage pip-installs ortllm"
    for args in installs:
        assert all("[" not in w for w in args), f"the image installs an extra: {args}"
        assert not any(w.lower().startswith(BUILD_ONLY) for w in args), args
        assert any(re.search(r"ortllm-\S*\.whl$", w) for w in args), f"the image installs ortllm's wheel: {args}"
    for run in image().all("RUN"):
        if "apt-get" in run.args and "install" in run.args:
            packages = shlex.split(run.args.split("install", 1)[1].split("&&")[0])
            assert not set(packages) & set(COMPILERS), f"the image installs a compiler: {packages}"


def test_runs_as_a_non_root_user_it_creates():
    img = image()
    assert img.last("USER").args.split(":")[0] not in ("root", "0")
    assert 0 not in user_ids(img)
    keywords = [i.keyword for i in img.instructions]
    assert keywords.index("ENTRYPOINT") > len(keywords) - 1 - keywords[::-1].index("USER"), \
        "USER comes before the ENTRYPOINT"


def test_expose_is_the_serve_default_port():
    img = image()
    default = ServiceConfig().port
    assert img.last("EXPOSE").args.split("/")[0] == str(default)
    assert img.env()["ORTLLM_PORT"] == str(default)
    assert img.env()["ORTLLM_HOST"] == "0.0.0.0"          # reachable through the container's published port


def test_ortllm_home_is_the_volume():
    img = image()
    volumes = img.last("VOLUME").exec_form()
    assert volumes == [img.env()["ORTLLM_HOME"]]


def test_entrypoint_serves_the_baked_model_unless_told_otherwise():
    img = image()
    assert img.last("ENTRYPOINT").exec_form() == ["ortllm", "serve"]
    assert img.last("CMD").exec_form() == []        # `docker run IMAGE [NAME|PATH] [flags]` appends to serve
    # ${BAKE_MODEL:+PATH}: the baked model's path, or empty (serve then asks for a model) when none is baked
    m = re.fullmatch(r"\$\{BAKE_MODEL:\+(/\S+)\}", img.env()["ORTLLM_ARTIFACT"])
    assert m, img.env()["ORTLLM_ARTIFACT"]
    artifact = m.group(1)
    assert global_args()["BAKE_MODEL"] == "smollm2-135m-instruct"      # the default: SmolLM2's
    assert any("ARG BAKE_MODEL" == f"ARG {a.args}" for a in img.all("ARG")), "the image stage sees BAKE_MODEL"
    assert any(c.args.split()[-1] == artifact for c in img.all("COPY")), "ORTLLM_ARTIFACT is the baked model's path"
    build = stages()[0]
    assert any(f"--out {artifact}" in r.args for r in build.all("RUN")), "the build stage builds it there"


def test_healthcheck_asks_health_of_a_live_server(tiny_live):
    argv = healthcheck_argv(image())
    assert health_path(image()) == "/health"
    assert argv[0] == "python3", argv     # the image's venv python (on PATH); sys.executable here
    argv = [sys.executable] + argv[1:]
    port = tiny_live.url.rsplit(":", 1)[1]
    ok = subprocess.run(argv, env={**os.environ, "ORTLLM_PORT": port}, capture_output=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    with socket.socket() as s:                      # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = str(s.getsockname()[1])
    down = subprocess.run(argv, env={**os.environ, "ORTLLM_PORT": closed}, capture_output=True, timeout=30)
    assert down.returncode != 0
