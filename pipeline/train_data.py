"""Training examples for `ortllm adapters train`: a JSONL file of the user's chats (or a generated task), checked
line by line, rendered with the artifact's chat template as the runtime renders it, and tokenized with the loss
on the assistant turns only.

A line is one of
  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}   a chat, >= 1 assistant turn
  {"prompt": "...", "completion": "..."}                                         one user turn and its reply
Every bad line is reported (line number and what is wrong) before anything trains.

Masking, per assistant turn i of a chat (the runtime's prompt is the template with add_generation_prompt):
  context = template(messages[:i], add_generation_prompt=True)     minus what earlier turns rendered
  answer  = template(messages[:i + 1])[len(context so far):]       e.g. "Hi!<|im_end|>\n"
each tokenized alone (the prompt's tokens are the ones the runtime feeds; the answer's the ones it must generate);
labels are the token ids on the answer up to and including its first end-of-turn (EOS) token, -100 elsewhere.
Without a chat template, a prompt/completion line is plain text: the prompt (with the tokenizer's BOS, as the runtime
encodes a plain prompt), then the completion and an EOS.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import BuildError

IGNORE = -100               # labels of tokens the loss skips (torch's cross_entropy ignore_index)
ROLES = ("system", "user", "assistant")
MAX_REPORTED = 20           # bad lines listed in one error


class TrainDataError(BuildError):
    """The training file has bad lines; the message lists them."""


@dataclass(frozen=True)
class Example:
    line: int                   # 1-based line of the JSONL file (0: generated)
    ids: tuple[int, ...]        # [L] token ids
    labels: tuple[int, ...]     # [L] the id where the loss counts (assistant turns), IGNORE elsewhere

    @property
    def trained_tokens(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


class _BadLine(BuildError, ValueError):
    pass


def _messages_of(obj) -> list[dict]:
    """The chat of one parsed line, checked; a prompt/completion pair becomes a user turn and its reply."""
    if not isinstance(obj, dict):
        raise _BadLine(f"a JSON object is expected, got {type(obj).__name__}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise _BadLine('"messages" must be a non-empty list of {"role": ..., "content": ...}')
        for k, m in enumerate(msgs, 1):
            if not isinstance(m, dict):
                raise _BadLine(f"message {k} is not an object")
            if m.get("role") not in ROLES:
                raise _BadLine(f"message {k} has role {m.get('role')!r}; roles: {', '.join(ROLES)}")
            if not isinstance(m.get("content"), str):
                raise _BadLine(f"message {k} ({m['role']}) has no \"content\" string")
        if not any(m["role"] == "assistant" for m in msgs):
            raise _BadLine("no assistant message: nothing to learn from this chat")
        return [{"role": m["role"], "content": m["content"]} for m in msgs]
    if "prompt" in obj or "completion" in obj:
        p, c = obj.get("prompt"), obj.get("completion")
        if not isinstance(p, str) or not isinstance(c, str):
            raise _BadLine('"prompt" and "completion" must both be strings')
        if not c:
            raise _BadLine('"completion" is empty: nothing to learn')
        return [{"role": "user", "content": p}, {"role": "assistant", "content": c}]
    raise _BadLine('needs "messages" (a chat) or "prompt" and "completion"; has '
                   f"{', '.join(map(repr, sorted(obj))) or 'no keys'}")


class ChatEncoder:
    """Chats -> Examples for one artifact's tokenizer (runtime/tokenizer.py: the template as the runtime renders it)."""

    def __init__(self, tokenizer, eos_ids, max_len: int):
        self.tok, self.eos, self.max_len = tokenizer, set(int(e) for e in eos_ids), max_len
        self.eos_id = int(next(iter(eos_ids)))

    def _answer_labels(self, ids: list[int]) -> list[int]:
        """Labels of an answer's tokens: up to and including its first EOS; what the template puts after it (a
        newline before the next turn) is context."""
        out, ended = [], False
        for t in ids:
            out.append(IGNORE if ended else t)
            ended = ended or t in self.eos
        return out

    def encode(self, messages: list[dict], line: int = 0) -> Example:
        if not self.tok.chat_template:
            return self._encode_plain(messages, line)
        ids, labels, done = [], [], ""
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prompt = self._render(messages[:i], True)
            through = self._render(messages[:i + 1], False)
            if not prompt.startswith(done) or not through.startswith(prompt):
                raise _BadLine("the chat template does not render this chat turn by turn (a turn's prompt is not "
                               "a prefix of the chat through it); send it as separate lines")
            ctx, ans = self.tok.encode(prompt[len(done):]), self.tok.encode(through[len(prompt):])
            ids += ctx + ans
            labels += [IGNORE] * len(ctx) + self._answer_labels(ans)
            done = through
        return self._checked(ids, labels, line)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        except Exception as e:  # noqa: BLE001 - jinja's TemplateError and what a template's own checks raise
            raise _BadLine(f"the model's chat template refuses it ({e})") from None

    def _encode_plain(self, messages: list[dict], line: int) -> Example:
        if [m["role"] for m in messages] != ["user", "assistant"]:
            raise _BadLine("this model has no chat template: only prompt/completion lines (or a user turn and "
                           "an assistant turn) can be trained")
        ctx = self.tok.encode(messages[0]["content"], add_special_tokens=True)
        ans = self.tok.encode(messages[1]["content"]) + [self.eos_id]
        return self._checked(ctx + ans, [IGNORE] * len(ctx) + ans, line)

    def _checked(self, ids: list[int], labels: list[int], line: int) -> Example:
        if len(ids) > self.max_len:
            raise _BadLine(f"{len(ids)} tokens, longer than the model's context ({self.max_len}); shorten it or "
                           "split the chat")
        if not any(t != IGNORE for t in labels):
            raise _BadLine("the assistant turns render to no tokens: nothing to learn")
        return Example(line, tuple(ids), tuple(labels))


def read_jsonl(path: Path, encoder: ChatEncoder) -> list[Example]:
    """Every line of the file as an Example; a TrainDataError listing all bad lines if any is bad. Blank lines
    are skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainDataError(f"--data {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TrainDataError(f"cannot read --data {path} as UTF-8 text ({e})") from None
    examples, bad = [], []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            try:
                obj = json.loads(raw)
            except ValueError as e:
                raise _BadLine(f"not JSON ({e})") from None
            examples.append(encoder.encode(_messages_of(obj), n))
        except _BadLine as e:
            bad.append(f"line {n}: {e}")
    if bad:
        more = f"\n  ... and {len(bad) - MAX_REPORTED} more" if len(bad) > MAX_REPORTED else ""
        raise TrainDataError(f"{path}: {len(bad)} bad line{'s' * (len(bad) > 1)} of {len(examples) + len(bad)}; "
                             "fix or remove them:\n  " + "\n  ".join(bad[:MAX_REPORTED]) + more)
    if not examples:
        raise TrainDataError(f"{path} holds no examples (one JSON object a line)")
    return examples


def task_examples(task: str, n: int, split: str, seed: int, encoder: ChatEncoder) -> list[Example]:
    """n generated examples of a task (calibration/adapter_tasks.py) as chats."""
    from ortllm.calibration.adapter_tasks import make_split

    try:
        generated = make_split(task, n, split, seed)
    except ValueError as e:
        raise BuildError(f"--task: {e}") from None
    return [encoder.encode([{"role": "user", "content": ex.prompt}, {"role": "assistant", "content": ex.answer}])
            for ex in generated]


def split_eval(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, held-out): a seeded draw of round(fraction * n) lines (at least one when fraction > 0), never all."""
    n = len(examples)
    n_eval = 0 if fraction <= 0 or n < 2 else min(n - 1, max(1, round(fraction * n)))
    order = np.random.default_rng(seed).permutation(n)
    held = set(order[:n_eval].tolist())
    return ([e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held])


def batch_indices(n: int, batch: int, step: int, seed: int) -> list[int]:
    """The examples of optimizer step `step` (0-based): consecutive slices of a seeded shuffle per epoch, so a
    resumed run draws the batches the uninterrupted one would have."""
    batch = min(batch, n)
    perms: dict[int, np.ndarray] = {}      # epoch -> its order of the n examples
    out = []
    for i in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(i, n)
        if epoch not in perms:
            perms[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
        out.append(int(perms[epoch][pos]))
    return out


def collate(examples: list[Example], pad_id: int):
    """(input_ids [B, L], labels [B, L], attention_mask [B, L]) torch tensors, right-padded to the longest."""
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for r, e in enumerate(examples):
        ids[r, :len(e.ids)] = torch.tensor(e.ids)
        labels[r, :len(e.ids)] = torch.tensor(e.labels)
        mask[r, :len(e.ids)] = 1
    return ids, labels, mask
