"""`ortllm generate`: one prompt, streamed as text. Engine artifacts run on the Engine; portable ones on
the simple decode loop (stock ONNX Runtime, no ops library). A verb of the command line, built on the runtime's
public pieces (nothing in the runtime calls it)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ortllm.runtime import contract as C
from ortllm.runtime.artifact import ArtifactError, load_artifact
from ortllm.runtime.detokenizer import IncrementalDetokenizer
from ortllm.runtime.errors import EmptyPrompt
from ortllm.runtime.sampler import RowState, Sampler, request_generator
from ortllm.runtime.sampling_params import SamplingParams, fit_max_tokens


def chat_messages(prompt: str, system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def generate_text(artifact_path: Path, prompt: str, *, chat: bool = False, system: str | None = None,
                  max_tokens: int = 128, temperature: float = 0.0, seed: int | None = None,
                  threads: int | None = None, adapter: str | None = None) -> Iterator[str]:
    """Yield text deltas of the completion (never half a UTF-8 character)."""
    from ortllm.runtime.tokenizer import Tokenizer

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, adapter=adapter).validate()
    if not prompt.strip():
        raise EmptyPrompt("prompt is empty; pass some text with --prompt")
    artifact = load_artifact(artifact_path)
    tok = Tokenizer.from_dir(artifact.path)
    text = tok.apply_chat_template(chat_messages(prompt, system)) if chat else prompt
    ids = tok.encode(text, add_special_tokens=not chat)
    if artifact.graph == "engine":
        from ortllm.runtime.engine import Engine
        overrides = {"threads": threads} if threads else {}
        with Engine.from_artifact(artifact.path, **overrides) as engine:
            yield from engine.stream(ids, params)
        return
    if adapter is not None:
        raise ArtifactError(f"{artifact.path} is a portable artifact, which serves no adapters; rebuild with "
                            "--graph engine")
    yield from _portable_stream(artifact, tok, ids, params, threads)


def _portable_stream(artifact, tok, ids: list[int], params: SamplingParams, threads) -> Iterator[str]:
    from ortllm.runtime.portable_model import PortableModel

    model = PortableModel.from_artifact(artifact, threads=threads)
    params.max_tokens = fit_max_tokens(len(ids), params.max_tokens, model.context_length)
    eos = set(artifact.read_json(C.GENERATION)["eos_token_ids"])
    detok = IncrementalDetokenizer(lambda t: tok.decode(t, skip_special_tokens=True), ids, stop_token_ids=eos)
    row = RowState(params, None if params.greedy else request_generator(params.seed), detok.output_token_ids, ids)
    sampler = Sampler()
    choose = lambda logits: int(sampler.sample(logits[None].astype(np.float32), [row]).token_ids[0])  # noqa: E731
    for t in model.generate_ids(ids, params.max_tokens, eos, choose):
        yield detok.step([t])
        if detok.finished:
            break
    yield detok.flush()
