"""Peers for `ortllm bench --peers`: llama.cpp, onnxruntime-genai and transformers, each driven in its own process.

The drivers (llamacpp_driver.py, genai_driver.py, transformers_driver.py, with _common.py) run inside the
peers' virtualenv .venv-peers (made by ci/install_peers.sh, i.e. `make bench-peers`) and import nothing of
ortllm; so do gguf_export.py and gguf_check.py, which write and check llama.cpp's GGUF of a recipe that ships
none. runner.py runs in ortllm's venv and drives them. This file imports nothing, so that
`.venv-peers/bin/python -m ortllm.bench.peers.X_driver` works from the repo root without ortllm installed.
"""
