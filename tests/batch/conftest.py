"""The batch job's fixtures: the tiny engine with two LoRA adapters, and a mixed OpenAI Batch input."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

ADAPTERS = ("qv", "mlp")
BASE = "llama-tiny-random"     # the recipe: the base model's name, as the service names it


@pytest.fixture(scope="session")
def batch_artifact(tiny_int4, tiny_weights, tmp_path_factory, adapted) -> Path:
    """tiny_int4 (hard-linked: tests/conftest.py adapted) with adapters qv (q,v) and mlp (gate,up,down). int4, not
    fp32: QLinear gives a row the same bits in any batch, so the batch job and the service (each batching the lines
    its own way) must agree token for token; on fp32 weights ORT's MatMul rounds by batch and a near-tie at one
    greedy step flipped a line's text now and then (test_200_mixed_lines_equal_the_service)."""
    from tests.reference.peft_lora import make_peft_lora

    base = tmp_path_factory.mktemp("batch")
    for k, (name, targets) in enumerate(zip(ADAPTERS, [["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"]])):
        make_peft_lora(tiny_weights, base / name, seed=20 + k, r=8, targets=targets)
    return adapted(tiny_int4, {name: base / name for name in ADAPTERS})


PREFIXES = ["You are a careful assistant. ", "Translate to French: ", "Q: what is 2+2? A:", ""]


def valid_body(i: int, rng: random.Random) -> tuple[str, dict]:
    """(url, body) of a good request: chat or completions, base or an adapter, greedy or seeded."""
    model = [None, BASE, *ADAPTERS][i % 4]
    text = PREFIXES[i % len(PREFIXES)] + "item %d " % i + "lorem ipsum " * rng.randint(0, 12)
    body: dict = {"max_tokens": rng.randint(2, 20), "temperature": 0}
    if model is not None:
        body["model"] = model
    if i % 7 == 3:
        body.update(temperature=0.8, top_p=0.9, seed=i)          # seeded: the same tokens whatever the batch
    if i % 3 == 0:
        body["messages"] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
        if i % 11 == 0:
            body.update(logprobs=True, top_logprobs=2)
        return "/v1/chat/completions", body
    body["prompt"] = text
    if i % 11 == 1:
        body["logprobs"] = 2
    if i % 13 == 2:
        body["stop"] = ["m"]
    return "/v1/completions", body


# line (0-based index) -> (what is wrong, expected status or None for a line-level error, error code)
BAD = {
    5: ("not json", None, "invalid_json"),
    17: ("unknown url", None, "invalid_url"),
    29: ("GET", None, "invalid_method"),
    41: ("temperature not a number", 400, None),
    53: ("unknown adapter", 404, "model_not_found"),
    65: ("duplicate custom_id", None, "duplicate_custom_id"),
    77: ("missing custom_id", None, "missing_custom_id"),
    89: ("body not an object", 400, "invalid_json"),
    101: ("empty prompt", 400, "empty_prompt"),
    113: ("prompt past the context", 400, "context_length_exceeded"),
    125: ("stream", 400, None),
    137: ("n=9", 400, None),
}
# a good line whose max_tokens runs past the context: capped to the room left (runtime fit_max_tokens)
PAST_CONTEXT = 149


def mixed_lines(n: int = 200, seed: int = 0) -> list[str]:
    """n input lines: good requests of every kind and, at the BAD indices, malformed ones."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        url, body = valid_body(i, rng)
        line = {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}
        what = BAD.get(i, (None,))[0]
        if what == "not json":
            lines.append('{"custom_id": "req-%d", "method": "POST", ' % i)
            continue
        if what == "unknown url":
            line["url"] = "/v1/embeddings"
        elif what == "GET":
            line["method"] = "GET"
        elif what == "temperature not a number":
            body["temperature"] = "hot"
        elif what == "unknown adapter":
            body["model"] = "no-such-adapter"
        elif what == "duplicate custom_id":
            line["custom_id"] = "req-3"
        elif what == "missing custom_id":
            del line["custom_id"]
        elif what == "body not an object":
            line["body"] = ["not", "an", "object"]
        elif what == "empty prompt":
            line["url"], line["body"] = "/v1/completions", {"prompt": "", "max_tokens": 4}
        elif what == "prompt past the context":
            line["url"], line["body"] = "/v1/completions", {"prompt": "x" * 600, "max_tokens": 4, "temperature": 0}
        elif i == PAST_CONTEXT:
            line["url"], line["body"] = "/v1/completions", {"prompt": "x" * 500, "max_tokens": 100_000,
                                                              "temperature": 0, "ignore_eos": True}
        elif what == "stream":
            body["stream"] = True
        elif what == "n=9":
            body["n"] = 9
        lines.append(json.dumps(line))
    return lines


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def read_output(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "torn last line"
    return [json.loads(x) for x in data.splitlines()]


def comparable(line: dict) -> dict:
    """An output line without what differs between runs: `created`, and the prompt tokens served from the
    prefix cache (`usage.prompt_tokens_details.cached_tokens`: each engine's cache history)."""
    line = json.loads(json.dumps(line))
    body = (line.get("response") or {}).get("body") or {}
    body.pop("created", None)
    (body.get("usage") or {}).pop("prompt_tokens_details", None)
    return line


def assert_same(a, b, where: str = "") -> None:
    """Equal JSON, floats (logprobs) within 1e-4: the last bits of a logit depend on the batch it ran in."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-4, (where, a, b)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (where, a, b)
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b, (where, a, b)
