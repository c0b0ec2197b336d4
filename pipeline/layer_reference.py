"""The in-build quality check's fp32 reference run one layer at a time, for models whose fp32 copy does not fit in
memory (an 8B model's is 32 GB): each stage of the fp32 engine graph (pipeline/graph_stages.py) is built into a
scratch directory, run over every held-out window, and dropped before the next, so the process holds one layer's
fp32 weights (and, while scoring, the LM head's) instead of the model's.

    windows -> embed stage -> hidden [n, H] per window
            -> layer 0 .. L - 1: each window one sequence of its own (positions 0.., KV blocks 1.., the pool zeroed
               per layer), hidden replaced by the layer's output
            -> head stage, when the scorer asks for a window's logits: [chunk, V] at a time

What it returns is what calibration/fidelity's EngineScorer returns for the whole fp32 engine graph of the same
weights (a test compares them on SmolLM2), so the quality figures are the same figures, at the cost of writing each
layer's fp32 weights to disk once more.

    LayerReference(weights, scratch, block_size).scorer(windows)   -> .logits(ids, chunk) per window, then close()
"""
from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from ortllm.runtime import contract as C

from .graph_stages import HEAD, HIDDEN_IN
from .stage_runner import Stages
from .weights import ModelWeights, tensor_shape



def fp32_bytes(weights: ModelWeights) -> int:
    """Bytes of the model's weights in fp32 (what a whole fp32 reference session holds, at least)."""
    return 4 * sum(int(np.prod(tensor_shape(weights.tensors, n))) for n in weights.tensors)


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def streams_by_default(weights: ModelWeights) -> bool:
    """Whether `--quality-reference auto` runs the reference layer by layer: when the fp32 weights exceed a third of
    the memory available now (the whole reference session holds them and MLAS's packed copy; the quantized
    candidate's session and the build share the rest)."""
    avail = available_bytes()
    return avail is not None and fp32_bytes(weights) > avail // 3


def _window_key(ids) -> str:
    return hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()


class LayerReference:
    """scorer(windows) runs embed and every layer over the windows, then serves their logits through the head."""

    # quality.json's "reference" of a check run this way
    description = ("the same weights in fp32 with an fp32 KV cache (the engine graph), run one layer at a time in "
                   "the build (bounded memory)")

    def __init__(self, weights: ModelWeights, scratch: Path, block_size: int, threads: int | None = None, log=print):
        self.weights, self.scratch, self.log = weights, Path(scratch), log
        self.stages = Stages(weights, scratch, block_size, threads)
        self.seconds = 0.0           # time in the stages (builds and runs)
        self._head = None

    def scorer(self, windows: list[list[int]]) -> "StreamedScorer":
        """Run every stage but the head over `windows` (token id lists of at most the model's context)."""
        start = time.perf_counter()
        layers = self.weights.config.num_layers
        hidden = self.stages.embed(windows)
        for i in range(layers):
            self.stages.layer(i, hidden)
            self.log(f"quality check: fp32 reference layer {i + 1}/{layers} done")
        self.seconds += time.perf_counter() - start
        return StreamedScorer(self, {_window_key(w): h for w, h in zip(windows, hidden)})

    def head_logits(self, h: np.ndarray) -> np.ndarray:
        """[n, H] final hidden states -> [n, V] fp32 logits (the head stage, opened on first use)."""
        if self._head is None:
            start = time.perf_counter()
            self._head = self.stages.session(HEAD)
            self.seconds += time.perf_counter() - start
        return self._head.run([C.LOGITS], {HIDDEN_IN: np.ascontiguousarray(h)})[0]

    def close(self) -> None:
        self._head = None
        shutil.rmtree(self.scratch, ignore_errors=True)


class StreamedScorer:
    """The reference scorer of windows LayerReference.scorer ran: logits(ids, chunk) as fidelity's scorers give
    them, row j predicting the token after ids[j]."""

    def __init__(self, ref: LayerReference, hidden: dict[str, np.ndarray]):
        self._ref, self._hidden = ref, hidden

    def logits(self, ids: list[int], chunk: int = 512) -> Iterator[np.ndarray]:
        h = self._hidden.get(_window_key(ids))
        if h is None:
            raise KeyError("the layer-by-layer reference scores only the windows it was given")
        for start in range(0, len(h), chunk):
            yield self._ref.head_logits(h[start:start + chunk])
