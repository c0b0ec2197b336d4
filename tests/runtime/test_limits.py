"""runtime/limits.py: how many tokens a sequence may hold, decided in one place, and a scan that fails when a second
place computes it (reads max_model_len, calls fit_max_tokens or raises PromptTooLong itself)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ortllm.runtime.config import SchedulerConfig
from ortllm.runtime.errors import PromptTooLong
from ortllm.runtime.limits import CONTEXT, MAX_MODEL_LEN, SequenceLimits

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("runtime", "protocol", "service", "batch", "cli", "calibration", "pipeline")   # product code, not bench
# where each sign of a limit computation is allowed, and why
ALLOWED = {
    "max_model_len": {"runtime/limits.py": "the one place", "runtime/config.py": "declares and validates it"},
    "fit_max_tokens": {"runtime/limits.py": "the one place", "runtime/sampling_params.py": "the rule's arithmetic",
                       "cli/generate.py": "a portable artifact has no engine: its context is its only limit"},
    "PromptTooLong": {"runtime/limits.py": "the one place", "runtime/sampling_params.py": "the rule's arithmetic",
                      "runtime/errors.py": "declares it"},
}


def limit_computations(path: Path, rel: str) -> list[str]:
    """Each place in one file that reads `.max_model_len`, or calls fit_max_tokens / PromptTooLong, where it is
    not allowed."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "max_model_len" and isinstance(node.ctx, ast.Load):
            sign = "max_model_len"
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name not in ("fit_max_tokens", "PromptTooLong") or (
                    isinstance(node.func, ast.Attribute) and name == "fit_max_tokens"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "limits"):
                continue            # engine.limits.fit_max_tokens(...): asking the one place
            sign = name
        else:
            continue
        if rel not in ALLOWED[sign]:
            out.append(f"{rel}:{node.lineno} {sign}")
    return out


def scan(root: Path) -> list[str]:
    out = []
    for pkg in SCANNED:
        for f in sorted((root / pkg).rglob("*.py")):
            out += limit_computations(f, f.relative_to(root).as_posix())
    return out


def test_no_second_place_computes_a_sequences_limits():
    assert scan(ROOT) == [], "ask engine.limits (runtime/limits.py) instead of computing a sequence's room"


def test_the_scan_catches_a_planted_computation(tmp_path):
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "bad.py").write_text(
        "def room(engine):\n"
        "    cap = engine.config.scheduler.max_model_len\n"
        "    return fit_max_tokens(3, None, cap)\n"
        "def ok(engine):\n"
        "    return engine.limits.fit_max_tokens(3, None)\n")
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "limits.py").write_text("def f(c):\n    return c.max_model_len\n")
    assert scan(tmp_path) == ["service/bad.py:2 max_model_len", "service/bad.py:3 fit_max_tokens"]


def test_the_smallest_limit_sets_the_room_and_names_itself():
    lim = SequenceLimits(kv_pool_blocks=63, block_size=16, max_model_len=512, context_length=512)
    assert (lim.room, lim.what) == (512, CONTEXT)                        # a tie: the model's own limit is named
    lim = SequenceLimits.of(SchedulerConfig(max_model_len=256), 63, 16, context_length=512)
    assert (lim.room, lim.what) == (256, MAX_MODEL_LEN)
    lim = SequenceLimits(kv_pool_blocks=4, block_size=4, max_model_len=None, context_length=512)
    assert lim.room == 16 and "KV pool" in lim.what and "raise num_blocks" in lim.what
    assert SequenceLimits(kv_pool_blocks=4, block_size=4).room == 16     # a scheduler without a model


def test_the_three_questions():
    lim = SequenceLimits(kv_pool_blocks=100, block_size=16, context_length=64)
    assert lim.fit_max_tokens(10, 100) == 54 and lim.fit_max_tokens(10, None) == 54 and lim.fit_max_tokens(10, 8) == 8
    with pytest.raises(PromptTooLong, match="prompt has 64 tokens but at most 63 fit .the model's context length."):
        lim.fit_max_tokens(64, 1)
    lim.check_prompt(64)                                   # an embedding may fill the whole context
    with pytest.raises(PromptTooLong, match="prompt has 65 tokens but at most 64 fit"):
        lim.check_prompt(65)
    lim.admit(60, 4)
    with pytest.raises(PromptTooLong, match="prompt has 60 tokens and max_tokens is 5: 65 tokens, but at most 64"):
        lim.admit(60, 5)


def test_the_engine_and_its_scheduler_share_one_limits(tiny_engine):
    """Regression: the engine capped max_tokens to the context and max_model_len only, so a request past the KV pool
    got the scheduler's PromptTooLong from Engine.submit and a capped max_tokens over HTTP; both cap it now."""
    from ortllm.runtime.engine import Engine
    from ortllm.runtime.sampling_params import SamplingParams

    with Engine.from_artifact(tiny_engine, num_blocks=9, max_model_len=256) as engine:   # 8 usable blocks x 16
        assert engine.limits is engine.scheduler.limits
        assert engine.limits.context_length == engine.context_length and engine.limits.max_model_len == 256
        assert engine.limits.kv_pool_tokens == engine.stats()["kv_blocks_total"] * engine.config.cache.block_size
        assert engine.limits.room == 128 and "KV pool" in engine.limits.what
        out = engine.generate([list(range(3, 103))], SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
        assert len(out[0].token_ids) == 28 and out[0].finish_reason == "length"
        with pytest.raises(PromptTooLong, match="at most 128 fit .the KV pool"):
            engine.submit_embed(list(range(3, 132)))
