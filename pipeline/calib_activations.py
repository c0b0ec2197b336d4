"""Calibration inputs of every projection, for GPTQ and SmoothQuant: H = 2/n X^T X per (layer, input) of the fp32 model.

    calibration text -> token windows of CALIB_CTX tokens, --calib-tokens in all
    the same weights as an fp32 portable graph in a scratch directory, with the input of each projection
    matmul appended as a graph output (node paths of pipeline/graph_portable.py, quant=None):
        /model/layers.{i}/attn/q_k_v_proj/MatMul   input 0 = input_layernorm output      -> q, k, v_proj
        /model/layers.{i}/attn/o_proj/MatMul       input 0 = attention context           -> o_proj
        /model/layers.{i}/mlp/gate_up_proj/MatMul  input 0 = post_attention_layernorm    -> gate, up_proj
        /model/layers.{i}/mlp/down_proj/MatMul     input 0 = silu(gate) * up             -> down_proj
        /lm_head/Gemm                              input 0 = final norm output           -> lm_head (int4)
    onnxruntime over the windows, one window at a time -> sum of X^T X per input (fp32 products of
    <= CALIB_CTX rows, summed in float64)

Non-sequential GPTQ: every layer is calibrated on the fp32 model's activations, not on those of the
already-quantized layers before it (the paper's sequential variant); one forward pass serves all layers.

Memory: the float64 accumulators of all inputs are 8 * L * (3 H^2 + I^2) bytes (SmolLM2-135M 0.8 GB,
TinyLlama 7.8 GB), so inputs are captured in groups that fit `budget_bytes`, one forward pass per group,
when the graph builder first asks for a tensor of that group (builders go layer by layer, so each group
is captured once: SmolLM2 in one pass, TinyLlama in ~8). The capture session holds its own fp32 copy of
the weights while the graph is built.

Data: the project's corpus (calibration/data.py) read from its end, interleaved with chat prompts of
another seed than the fidelity stream's (CORPUS_SEED + 1), EOS-joined. The fidelity stream starts with
the same corpus from its beginning, so calibration and the fidelity check (the in-build 512 tokens,
`ortllm eval`'s 16k) share no corpus text while both fit the corpus (SmolLM2: 112k tokens in all).
HumanEval is left out: the humaneval suite scores all 164 canonical solutions. Models without a
tokenizer (the random test models) calibrate on seeded random ids.
"""
from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortllm.runtime import contract as C

from .errors import BuildError
from .weights import ModelWeights

CALIB_CTX = 256                  # tokens per window (fewer when the model's context is shorter)
CALIB_SEED = 1                   # random ids of models without a tokenizer (quality.json uses 0)
MEMORY_BUDGET = 1 << 30          # bytes of float64 accumulators held at once


@dataclass(frozen=True)
class CalibrationData:
    windows: list[list[int]]     # token windows of <= ctx tokens, run independently
    sha256: dict                 # source name -> sha256 of its text; "tokens" -> sha256 of the int32 ids
    sources: str                 # how the stream was made (for the report)


def _sha_tokens(windows: list[list[int]]) -> str:
    return hashlib.sha256(np.concatenate([np.asarray(w, np.int32) for w in windows]).tobytes()).hexdigest()


def calibration_data(tokenizer, tokens: int, ctx: int, vocab_size: int) -> CalibrationData:
    """`tokens` calibration tokens in windows of `ctx` (the last one shorter); tokenizer None: seeded random ids."""
    if tokenizer is None:
        ids = np.random.default_rng(CALIB_SEED).integers(0, vocab_size, tokens).tolist()
        windows = [ids[i:i + ctx] for i in range(0, tokens, ctx)]
        return CalibrationData(windows, {"tokens": _sha_tokens(windows)},
                               f"seeded random token ids (numpy default_rng({CALIB_SEED}); the model has no tokenizer)")
    from ortllm.calibration.data import CORPUS_SEED, chat_conversations, corpus_documents, render_chat, sha256_text

    corpus = list(reversed(corpus_documents()))
    chats = [render_chat(tokenizer, conv, add_generation_prompt=True)
             for conv in chat_conversations(64, seed=CORPUS_SEED + 1)]
    eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
    stream: list[int] = []
    for i in range(max(len(corpus), len(chats))):
        for src in (corpus, chats):
            if i < len(src) and len(stream) < tokens:
                stream += tokenizer.encode(src[i]) + ([eos] if eos is not None else [])
    if len(stream) < tokens:
        raise BuildError(f"the calibration text holds {len(stream)} tokens; --calib-tokens asks for {tokens}: "
                         f"lower --calib-tokens")
    stream = stream[:tokens]
    windows = [stream[i:i + ctx] for i in range(0, tokens, ctx)]
    return CalibrationData(
        windows,
        {"corpus": sha256_text("\0".join(corpus)), "chat": sha256_text("\0".join(chats)),
         "tokens": _sha_tokens(windows)},
        f"corpus (calibration/data.py, read from its end) + chat templates (seed {CORPUS_SEED + 1}), "
        "interleaved, EOS-joined; no HumanEval")


def _projection_inputs(weights: ModelWeights) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """Consuming node paths in build order, HF tensor name -> node path, node path -> K."""
    cfg = weights.config
    order, names, widths = [], {}, {}
    for i in range(cfg.num_layers):
        lp, hp = f"/model/layers.{i}", f"model.layers.{i}"
        for node, k, targets in (
                (f"{lp}/attn/q_k_v_proj/MatMul", cfg.hidden_size, ("self_attn.q", "self_attn.k", "self_attn.v")),
                (f"{lp}/attn/o_proj/MatMul", cfg.num_heads * cfg.head_dim, ("self_attn.o",)),
                (f"{lp}/mlp/gate_up_proj/MatMul", cfg.hidden_size, ("mlp.gate", "mlp.up")),
                (f"{lp}/mlp/down_proj/MatMul", cfg.intermediate_size, ("mlp.down",))):
            order.append(node)
            widths[node] = k
            names.update(dict.fromkeys([f"{hp}.{t}_proj.weight" for t in targets], node))
    order.append("/lm_head/Gemm")
    widths["/lm_head/Gemm"] = cfg.hidden_size
    names["lm_head.weight"] = "/lm_head/Gemm"
    return order, names, widths


class Calibration:
    """hessian(hf_name) -> H = 2/n X^T X [K, K] float64 of that projection's input, captured on first use.

    Owns `scratch` (the fp32 graph and the tokenizer files) until close(). names: the HF tensors to serve
    (None: every projection); the inputs of the others are neither fetched nor summed. tokenizer_dir: the
    model's tokenizer files already written there (a build's artifact directory), read instead of written again.
    diagonal_only: only channel_rms is served (SmoothQuant without GPTQ): each input's sum of squares per channel,
    every input in one pass, instead of X^T X (the products were ~60% of a SmolLM2 int8 build's calibration time)."""

    def __init__(self, weights: ModelWeights, tokens: int, scratch: Path, budget_bytes: int = MEMORY_BUDGET,
                 log=print, names: tuple[str, ...] | None = None, tokenizer_dir: Path | None = None,
                 diagonal_only: bool = False):
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper

        from .graph_portable import build_portable_graph

        self._setup(weights, tokens, scratch, log, names, tokenizer_dir, diagonal_only, budget_bytes)
        model_path = self.scratch / C.MODEL
        build_portable_graph(weights, model_path, self.scratch / C.MODEL_DATA, quant=None)
        model = onnx.load(str(model_path), load_external_data=False)
        consumers = {n.name: n.input[0] for n in model.graph.node}
        missing = [k for k in self.order if k not in consumers]
        if missing:
            raise RuntimeError(f"calibration: the fp32 graph has no node {missing[0]} (graph_portable node paths "
                               "changed; update pipeline/calib_activations.py)")
        self.tensors = {k: consumers[k] for k in self.order}
        have = {o.name for o in model.graph.output}
        for t in self.tensors.values():
            if t not in have:
                model.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
        capture_path = self.scratch / "capture.onnx"            # external data: model.onnx.data beside it
        capture_path.write_bytes(model.SerializeToString())
        self.session = ort.InferenceSession(str(capture_path), providers=["CPUExecutionProvider"])

    def _setup(self, weights: ModelWeights, tokens: int, scratch: Path, log, names, tokenizer_dir,
               diagonal_only: bool, budget_bytes: int) -> None:
        """The calibration text, the projection inputs served (names) and their capture groups."""
        self.scratch, self.log, self.cfg = Path(scratch), log, weights.config
        self.scratch.mkdir(parents=True, exist_ok=True)
        tokenizer = None
        if tokenizer_dir is not None or weights.write_tokenizer:
            from ortllm.runtime.tokenizer import Tokenizer
            if tokenizer_dir is None:
                weights.write_tokenizer(self.scratch)
            tokenizer = Tokenizer.from_dir(Path(tokenizer_dir or self.scratch))
        ctx = min(CALIB_CTX, self.cfg.max_position_embeddings)
        self.data = calibration_data(tokenizer, tokens, ctx, self.cfg.vocab_size)
        self.tokens = sum(len(w) for w in self.data.windows)
        self.order, self.names, self.widths = _projection_inputs(weights)
        if names is not None:
            unknown = [n for n in names if n not in self.names]
            if unknown:
                raise BuildError(f"calibration: no projection input for tensor {unknown[0]}")
            wanted = {self.names[n] for n in names}
            self.order = [k for k in self.order if k in wanted]
            self.names = {n: k for n, k in self.names.items() if k in wanted}
        self.diagonal_only = diagonal_only
        self.groups = [list(self.order)] if diagonal_only else self._groups(budget_bytes)
        self._h: dict[str, np.ndarray] = {}        # node path -> H (or its diagonal) of the group captured last
        self.passes, self.seconds = 0, 0.0     # forward passes and their time (the sums included)

    def _groups(self, budget: int) -> list[list[str]]:
        """Consecutive inputs whose float64 accumulators fit `budget` together (at least one each)."""
        groups, size = [[]], 0
        for key in self.order:
            nbytes = 8 * self.widths[key] ** 2
            if groups[-1] and size + nbytes > budget:
                groups.append([])
                size = 0
            groups[-1].append(key)
            size += nbytes
        return groups

    def _feeds(self, window: list[int]) -> dict:
        cfg, s = self.cfg, len(window)
        feeds = {C.INPUT_IDS: np.asarray([window], np.int64), C.ATTENTION_MASK: np.ones((1, s), np.int64),
                 C.POSITION_IDS: np.arange(s, dtype=np.int64)[None]}
        empty = np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
        for i in range(cfg.num_layers):
            feeds[C.past_key(i)] = feeds[C.past_value(i)] = empty
        return feeds

    def _capture(self, group: list[str]) -> None:
        """One forward pass over every window, summing X^T X of the group's inputs."""
        self._start_pass(group)
        start = time.perf_counter()
        fetch = [self.tensors[k] for k in group]
        for window in self.data.windows:
            for key, x in zip(group, self.session.run(fetch, self._feeds(window))):
                self._add(key, x)
        self._end_pass(start)

    def _start_pass(self, group: list[str]) -> None:
        self.passes += 1
        self.log(f"calibrating: pass {self.passes} ({len(group)} projection inputs of "
                 f"{len(self.order)}) over {self.tokens} tokens ...")
        self._h = self._fresh(group)

    def _fresh(self, group: list[str]) -> dict[str, np.ndarray]:
        shape = (lambda k: (k,)) if self.diagonal_only else (lambda k: (k, k))
        return {k: np.zeros(shape(self.widths[k]), np.float64) for k in group}

    def _add(self, key: str, x: np.ndarray) -> None:
        x = x.reshape(-1, self.widths[key])
        if self.diagonal_only:
            self._h[key] += np.einsum("ij,ij->j", x, x, dtype=np.float64)   # [K] sums of squares
        else:
            self._h[key] += x.T @ x                   # [K, K] fp32 product of <= CALIB_CTX rows

    def _end_pass(self, start: float) -> None:
        for h in self._h.values():
            h *= 2.0 / self.tokens
        self.seconds += time.perf_counter() - start

    def _captured(self, name: str) -> np.ndarray:
        key = self.names.get(name)
        if key is None:
            raise BuildError(f"GPTQ has no calibration input for tensor {name}; use --algo rtn|hqq")
        if key not in self._h:
            self._capture(next(g for g in self.groups if key in g))
        return self._h[key]

    def hessian(self, name: str) -> np.ndarray:
        """[K, K] float64, shared by the projections of one input (the same array each time): read only."""
        if self.diagonal_only:
            raise RuntimeError("Calibration(diagonal_only=True) serves channel_rms only, not hessian")
        return self._captured(name)

    def channel_rms(self, name: str) -> np.ndarray:
        """[K] RMS of each input channel of that projection over the calibration tokens (SmoothQuant)."""
        h = self._captured(name)
        return np.sqrt((h if self.diagonal_only else np.diag(h)) / 2.0)

    @property
    def info(self) -> dict:
        """The calibration's identity for the manifest and quality.json."""
        return {"tokens": self.tokens, "windows": len(self.data.windows), "ctx": len(self.data.windows[0]),
                "sha256": self.data.sha256, "sources": self.data.sources, "passes": self.passes}

    def close(self) -> None:
        self.session = None
        self._h = {}
        shutil.rmtree(self.scratch, ignore_errors=True)


def _layer_of(key: str, layers: int) -> int:
    """A projection input's layer (/model/layers.{i}/...), the LM head's after the last one."""
    return int(key.split("/")[2].split(".")[1]) if key.startswith("/model/layers.") else layers


class LayerCalibration(Calibration):
    """Calibration with the fp32 model run one layer at a time (pipeline/stage_runner.py: the fp32 engine graph's
    stages), for models whose fp32 copy does not fit in memory: the windows' hidden states are carried from layer to
    layer, and each layer's projection inputs are summed as the layer runs. The builders ask for the inputs layer by
    layer, so one pass serves them all (a request behind the pass starts a new one); a capture group is whole layers
    (the float64 accumulators of one layer at least: an 8B model's ~2 GB with X^T X, kilobytes for SmoothQuant's
    diagonal). Same interface and data as Calibration; the fp32 numbers are the engine graph's, not the portable
    graph's, so the Hessians agree with Calibration's to fp32 rounding, not bit for bit."""

    def __init__(self, weights: ModelWeights, tokens: int, scratch: Path, budget_bytes: int = MEMORY_BUDGET,
                 log=print, names: tuple[str, ...] | None = None, tokenizer_dir: Path | None = None,
                 diagonal_only: bool = False, block_size: int = 16):
        from .stage_runner import Stages

        self._setup(weights, tokens, scratch, log, names, tokenizer_dir, diagonal_only, budget_bytes)
        self.layers = weights.config.num_layers
        self.stages = Stages(weights, self.scratch / "stages", block_size)
        self._hidden: list[np.ndarray] | None = None     # the windows' hidden states before layer self._next
        self._next = 0

    def _groups(self, budget: int) -> list[list[str]]:
        """Consecutive whole layers' inputs whose float64 accumulators fit `budget` together (one layer at least)."""
        groups, size, last = [[]], 0, None
        for key in self.order:
            layer, nbytes = _layer_of(key, self.cfg.num_layers), 8 * self.widths[key] ** 2
            if groups[-1] and layer != last and size + nbytes > budget:
                groups.append([])
                size = 0
            groups[-1].append(key)
            size, last = size + nbytes, layer
        return groups

    def _capture(self, group: list[str]) -> None:
        """Carry the windows through the layers up to the group's last, summing its inputs on the way."""
        from .graph_stages import HEAD, HIDDEN_IN

        start = time.perf_counter()
        if self._hidden is None or self._next > _layer_of(group[0], self.layers):    # a new pass from the embedding
            self._start_pass(group)
            self._hidden, self._next = self.stages.embed(self.data.windows), 0
        else:
            self._h = self._fresh(group)
        last = _layer_of(group[-1], self.layers)
        while self._next <= min(last, self.layers - 1):
            i = self._next
            fetch = tuple(k for k in group if _layer_of(k, self.layers) == i)
            self.stages.layer(i, self._hidden, fetch, self._add)
            self.log(f"calibrating: layer {i + 1}/{self.layers} ...")
            self._next += 1
        if last == self.layers:                     # the LM head's input: the final norm's output
            head = self.stages.session(HEAD, ("/lm_head/Gemm",))
            for x in self._hidden:
                self._add("/lm_head/Gemm", head.run(head.fetched, {HIDDEN_IN: x})[0])
        self._end_pass(start)

    def close(self) -> None:
        self._hidden = None
        super().close()
