"""Logits of every position of a token window through the engine graph and its paged KV pool: what fidelity
(KLD, perplexity) and HumanEval's solution NLL score (calibration/). The model run the engine makes per step,
fed one sequence outside the scheduler, its KV in blocks 1.. of the pool, every row's logits returned.

    WindowScorer.from_artifact(artifact, ctx)   a session of its own, with a pool sized for ctx tokens
    engine.scorer()                             an idle engine's session and pool (no second session in memory)
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .artifact import Artifact
from .config import EngineConfig
from .model_runner import ModelRunner
from .scheduler_messages import ScheduledSeq


class WindowScorer:
    def __init__(self, runner: ModelRunner):
        self._runner = runner

    @classmethod
    def from_artifact(cls, artifact: Artifact, ctx: int, threads: int | None = None) -> "WindowScorer":
        """A new session whose KV pool holds one window of ctx tokens (and the null block)."""
        block = artifact.manifest.kv_block_size
        over = {"num_blocks": 2 + -(-ctx // block), "block_size": block}
        if threads:
            over["threads"] = threads
        return cls(ModelRunner(artifact, EngineConfig.from_overrides(artifact.path, **over)))

    def logits(self, ids: list[int], chunk: int = 512) -> Iterator[np.ndarray]:
        """[n, V] float32 per chunk of up to `chunk` tokens, in order: row j predicts the token after ids[j]."""
        blocks = list(range(1, 1 + -(-len(ids) // self._runner.block_size)))
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            yield self._runner.execute([ScheduledSeq("score", part, start, blocks, True, None)], all_logits=True)
