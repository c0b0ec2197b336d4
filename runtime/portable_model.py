"""Run the portable graph with a plain KV cache: the simple decode loop behind `ortllm generate`.

One sequence at a time, present -> past each step. The engine (paged KV, continuous batching) replaces
this for serving; it stays as the reference loop for portable artifacts and other ORT clients' parity.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import onnxruntime as ort

from . import contract as C
from .artifact import Artifact, ArtifactError
from .config import physical_cores


class PortableModel:
    """A decoder graph with the optimum/genai I/O convention (ours, or optimum-onnx's export of it)."""

    def __init__(self, model_path, model_config: C.ModelConfig, threads: int | None = None):
        self.num_layers = model_config.num_layers
        self.kv_shape = (model_config.num_kv_heads, model_config.head_dim)
        self.context_length = model_config.max_position_embeddings
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads or physical_cores()
        so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])

    @classmethod
    def from_artifact(cls, artifact: Artifact, threads: int | None = None) -> "PortableModel":
        if artifact.graph != "portable":
            raise ArtifactError(f"{artifact.path} holds a '{artifact.graph}' graph; the simple loop runs "
                                "portable graphs (rebuild with --graph portable)")
        return cls(artifact.file(C.MODEL), artifact.model, threads)

    def empty_past(self, batch: int = 1) -> list[np.ndarray]:
        z = np.zeros((batch, *self.kv_shape[:1], 0, self.kv_shape[1]), np.float32)
        return [z] * (2 * self.num_layers)

    def forward(self, ids: np.ndarray, past: list[np.ndarray], start: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """ids [1, S] at positions start.. -> logits [1, S, V], new past (present of this step)."""
        s = ids.shape[1]
        feeds = {
            C.INPUT_IDS: ids.astype(np.int64),
            C.ATTENTION_MASK: np.ones((ids.shape[0], start + s), np.int64),
            C.POSITION_IDS: np.arange(start, start + s, dtype=np.int64)[None].repeat(ids.shape[0], 0),
        }
        for i in range(self.num_layers):
            feeds[C.past_key(i)], feeds[C.past_value(i)] = past[2 * i], past[2 * i + 1]
        out = self.session.run(None, feeds)
        return out[0], out[1:]

    def greedy_logits(self, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
        """Greedy decode `steps` tokens with the KV cache; returns them and the logits that chose each [steps, V]."""
        logits, past = self.forward(np.asarray([prompt]), self.empty_past(), 0)
        tokens, rows = [], []
        for i in range(steps):
            rows.append(logits[0, -1])
            tokens.append(int(np.argmax(rows[-1])))
            if i + 1 < steps:
                logits, past = self.forward(np.asarray([[tokens[-1]]]), past, len(prompt) + i)
        return tokens, np.stack(rows)

    def generate_ids(self, prompt: list[int], max_tokens: int, eos_ids: set[int],
                     choose: Callable[[np.ndarray], int]) -> Iterator[int]:
        """Yield generated token ids one by one; `choose` maps last-position logits [V] to a token."""
        past = self.empty_past()
        logits, past = self.forward(np.asarray([prompt]), past, 0)
        pos = len(prompt)
        for _ in range(max_tokens):
            tok = choose(logits[0, -1])
            yield tok
            if tok in eos_ids or pos + 1 >= self.context_length:
                return
            logits, past = self.forward(np.asarray([[tok]]), past, pos)
            pos += 1
