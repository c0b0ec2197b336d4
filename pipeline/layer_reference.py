"""The in-build quality check's fp32 reference run one layer at a time, for models whose fp32 copy does not fit in
memory (an 8B model's is 32 GB): each stage of the fp32 engine graph (pipeline/graph_stages.py) is built into a
scratch directory, run over every held-out window, and dropped before the next, so the process holds one stage's
fp32 weights instead of the model's, and none of them once the quantized candidate is scored.

    windows -> embed stage -> hidden [n, H] per window
            -> layer 0 .. L - 1: each window one sequence of its own (positions 0.., KV blocks 1..), hidden replaced by
               the layer's output
            -> head stage -> each window's logits [n, V] into a file in scratch (an 8B model's 4.6k positions: 2.4 GB)
    scorer.logits(ids, chunk) reads them back [chunk, V] at a time

What it returns is bit for bit what calibration/fidelity's EngineScorer returns for the whole fp32 engine graph of
the same weights (tests/pipeline/test_layer_reference.py), so the quality figures are the same figures, at the cost of
writing each layer's fp32 weights, and the logits, to disk once more.

    LayerReference(weights, scratch, block_size).scorer(windows)   -> .logits(ids, chunk) per window, then close()
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np

from ortllm.runtime import contract as C
from ortllm.runtime.host_memory import available_memory

from .graph_stages import HEAD, HIDDEN_IN
from .stage_runner import Stages
from .weights import ModelWeights, tensor_shape



def fp32_bytes(weights: ModelWeights) -> int:
    """Bytes of the model's weights in fp32 (what a whole fp32 reference session holds, at least)."""
    return 4 * sum(int(np.prod(tensor_shape(weights.tensors, n))) for n in weights.tensors)


def streams_by_default(weights: ModelWeights) -> bool:
    """Whether `--quality-reference auto` runs the reference layer by layer: when the fp32 weights exceed a third of
    the memory available now (the whole reference session holds them and MLAS's packed copy; the quantized
    candidate's session and the build share the rest)."""
    avail = available_memory()
    return avail is not None and fp32_bytes(weights) > avail // 3


def _window_key(ids) -> str:
    return hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()


class LayerReference:
    """scorer(windows) runs every stage over the windows and keeps their logits on disk for the scorer."""

    # quality.json's "reference" of a check run this way
    description = ("the same weights in fp32 with an fp32 KV cache (the engine graph), run one layer at a time in "
                   "the build (bounded memory)")

    def __init__(self, weights: ModelWeights, scratch: Path, block_size: int, threads: int | None = None, log=print):
        self.weights, self.scratch, self.log = weights, Path(scratch), log
        self.stages = Stages(weights, scratch, block_size, threads)

    def scorer(self, windows: list[list[int]]) -> "StreamedScorer":
        """Run every stage over `windows` (token id lists of at most the model's context). The logits [n, V] of each
        window go to a file in scratch, and the head's session is closed before the scorer is returned: the quantized
        candidate's session, made next, never shares the process with the fp32 head (with MLAS's packed copy, twice
        an 8B model's 2.1 GB)."""
        layers = self.weights.config.num_layers
        hidden = self.stages.embed(windows)
        for i in range(layers):
            self.stages.layer(i, hidden)
            self.log(f"quality check: fp32 reference layer {i + 1}/{layers} done")
        head = self.stages.session(HEAD)
        path, rows = self.scratch / "reference-logits.f32", {}
        with open(path, "wb") as f:
            for w, h in zip(windows, hidden):
                at = f.tell()
                for s in range(0, len(h), CHUNK_ROWS):      # [rows, V] at a time: the head's output buffer
                    f.write(head.run([C.LOGITS], {HIDDEN_IN: np.ascontiguousarray(h[s:s + CHUNK_ROWS])})[0].tobytes())
                rows[_window_key(w)] = (at, len(h))
        del head, hidden
        return StreamedScorer(path, rows, self.weights.config.vocab_size)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


CHUNK_ROWS = 512     # head rows a run, and logits rows read back at a time


class StreamedScorer:
    """The reference scorer of windows LayerReference.scorer ran: logits(ids, chunk) as fidelity's scorers give
    them, row j predicting the token after ids[j], read back from the reference's logits file."""

    def __init__(self, path: Path, rows: dict[str, tuple[int, int]], vocab: int):
        self._path, self._rows, self._vocab = path, rows, vocab

    def logits(self, ids: list[int], chunk: int = 512) -> Iterator[np.ndarray]:
        at = self._rows.get(_window_key(ids))
        if at is None:
            raise KeyError("the layer-by-layer reference scores only the windows it was given")
        offset, n = at
        row_bytes = 4 * self._vocab
        with open(self._path, "rb") as f:
            f.seek(offset)
            for s in range(0, n, chunk):
                m = min(chunk, n - s)
                yield np.frombuffer(f.read(m * row_bytes), np.float32).reshape(m, self._vocab)
