"""`ortllm generate`: one prompt through the portable graph's simple decode loop, streamed as text."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from .artifact import load_artifact
from .errors import EmptyPrompt, PromptTooLong
from .portable_model import PortableModel
from .sampling_params import SamplingParams


def _chooser(params: SamplingParams):
    """last-position logits [V] -> token id; greedy at temperature 0, else seeded softmax sampling."""
    if params.greedy:
        return lambda logits: int(np.argmax(logits))
    rng = np.random.default_rng(params.seed)

    def choose(logits: np.ndarray) -> int:
        z = logits.astype(np.float64) / params.temperature
        p = np.exp(z - z.max())
        return int(rng.choice(len(p), p=p / p.sum()))
    return choose


def generate_text(artifact_path: Path, prompt: str, *, chat: bool = False, system: str | None = None,
                  max_tokens: int = 128, temperature: float = 0.0, seed: int | None = None,
                  threads: int | None = None) -> Iterator[str]:
    """Yield text deltas of the completion (never half a UTF-8 character)."""
    from .tokenizer import Tokenizer

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed).validate()
    if not prompt.strip():
        raise EmptyPrompt("prompt is empty; pass some text with --prompt")
    artifact = load_artifact(artifact_path)
    tok = Tokenizer.from_dir(artifact.path)
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
    else:
        text = prompt
    ids = tok.encode(text, add_special_tokens=not chat)
    model = PortableModel.from_artifact(artifact, threads=threads)
    if len(ids) >= model.context_length:
        raise PromptTooLong(len(ids), model.context_length - 1, what="the model's context length")
    eos = set(artifact.read_json("generation.json")["eos_token_ids"])

    out: list[int] = []
    emitted = ""
    for t in model.generate_ids(ids, params.max_tokens, eos, _chooser(params)):
        if t in eos:
            break
        out.append(t)
        text = tok.decode(out)
        if not text.endswith("\ufffd") and len(text) > len(emitted):
            yield text[len(emitted):]
            emitted = text
