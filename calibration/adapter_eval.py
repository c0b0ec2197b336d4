"""Task accuracy of an adapter (vs the base model) through the engine, and PEFT + transformers' outputs
on the same prompts for the reference comparison."""
from __future__ import annotations

from dataclasses import dataclass

from ortllm.runtime.sampling_params import SamplingParams

from .adapter_tasks import chat_prompt, make_split, score

MAX_TOKENS = 16


@dataclass
class TaskResult:
    task: str
    adapter: str | None
    n: int
    accuracy: float
    outputs: list[str]
    token_ids: list[list[int]]


def task_accuracy(engine, task: str, adapter: str | None, n: int = 100, seed: int = 0) -> TaskResult:
    """Greedy answers to n held-out prompts, all submitted at once (mixed into the engine's batches)."""
    examples = make_split(task, n, "eval", seed)
    prompts = [engine.tokenizer.encode(chat_prompt(engine.tokenizer, ex)) for ex in examples]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, adapter=adapter)
    outs = engine.generate(prompts, params)
    texts = [o.text for o in outs]
    acc = sum(score(t, ex.answer) for t, ex in zip(texts, examples)) / n
    return TaskResult(task, adapter, n, acc, texts, [o.token_ids for o in outs])


def peft_greedy_ids(peft_model, tokenizer, task: str, n: int, seed: int = 0, eos_ids=()) -> list[list[int]]:
    """PEFT + transformers greedy token ids on the same held-out prompts (stops at eos like the engine)."""
    import torch

    out = []
    for ex in make_split(task, n, "eval", seed):
        ids = tokenizer.encode(chat_prompt(tokenizer, ex))
        with torch.no_grad():
            gen = peft_model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                      eos_token_id=list(eos_ids) or None, pad_token_id=0)[0, len(ids):].tolist()
        out.append([t for t in gen if t not in eos_ids])
    return out
