"""`ortllm generate`: one prompt, streamed as text. Engine artifacts run on the Engine; portable ones on
the simple decode loop (stock ONNX Runtime, no ops library). A verb of the command line, built on the runtime's
public pieces (nothing in the runtime calls it). The runtime is imported when the verb runs: the parser is made
for every command."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .options import Option, add_options, declares, fill_defaults

if TYPE_CHECKING:
    from ortllm.runtime.sampling_params import SamplingParams

GENERATE_OPTIONS = (
    Option("--prompt", "the text to complete (with --chat: the user's message)", default=None),
    Option("--chat", "wrap the prompt in the model's chat template", lambda: generate_text),
    Option("--system", "system message (with --chat)", lambda: generate_text),
    Option("--adapter", "LoRA adapter of the artifact (ortllm adapters list)", lambda: generate_text),
    Option("--max-tokens", "tokens to generate at most", lambda: generate_text, metavar="N"),
    Option("--temperature", "0 = greedy", lambda: generate_text, metavar="T"),
    Option("--seed", "same seed, same text", lambda: generate_text, metavar="S"),
    Option("--threads", "intra-op threads", lambda: generate_text, default_text="physical cores", metavar="N"),
)


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="print a completion for one prompt")
    p.add_argument("artifact", type=Path)
    if declares("generate"):
        add_options(p, GENERATE_OPTIONS)
    p.set_defaults(run=run_generate, prepare=lambda a: fill_defaults(a, GENERATE_OPTIONS))


def run_generate(a) -> int:
    from ortllm.runtime.artifact import quality_line
    from ortllm.runtime.errors import EmptyPrompt

    if a.prompt is None:
        raise EmptyPrompt("ortllm generate needs --prompt TEXT (for a chat: ortllm run MODEL)")
    if a.artifact.is_dir() and (line := quality_line(a.artifact)):
        print(f"ortllm: {line}", file=sys.stderr)

    for piece in generate_text(a.artifact, a.prompt, chat=a.chat, system=a.system, max_tokens=a.max_tokens,
                               temperature=a.temperature, seed=a.seed, threads=a.threads, adapter=a.adapter):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def chat_messages(prompt: str, system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def generate_text(artifact_path: Path, prompt: str, *, chat: bool = False, system: str | None = None,
                  max_tokens: int = 128, temperature: float = 0.0, seed: int | None = None,
                  threads: int | None = None, adapter: str | None = None) -> Iterator[str]:
    """Yield text deltas of the completion (never half a UTF-8 character)."""
    from ortllm.runtime.artifact import ArtifactError, load_artifact
    from ortllm.runtime.errors import EmptyPrompt
    from ortllm.runtime.sampling_params import SamplingParams
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
    import numpy as np

    from ortllm.runtime import contract as C
    from ortllm.runtime.detokenizer import IncrementalDetokenizer
    from ortllm.runtime.portable_model import PortableModel
    from ortllm.runtime.sampler import RowState, Sampler, request_generator
    from ortllm.runtime.sampling_params import fit_max_tokens

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
