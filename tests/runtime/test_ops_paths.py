"""One process, every kernel path: an engine takes the path its config names (EngineConfig.ops_isa, the session
config entry ortllm.ops_isa), engines on different paths live side by side, and a path the CPU does not offer is
refused up front with the paths it does offer."""
from __future__ import annotations

import pytest

from ortllm.runtime import Engine, SamplingParams
from ortllm.runtime.config import ConfigError
from ortllm.runtime.ops_library import OpsLibraryError, ops_isas
from tests.conftest import _build

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["The capital of France is", "def add(a, b):", "1, 2, 3,"]


@pytest.fixture(scope="module")
def tiny_int4(tmp_path_factory):
    """llama-tiny-random int4 with an int8 KV cache: QLinear and the integer attention loops (no in-build quality
    check: nothing here reads it)."""
    return _build(tmp_path_factory, "llama-tiny-random", measured=False, quant="int4", kv="int8")


def test_every_offered_path_gives_the_same_greedy_tokens(tiny_int4):
    """The vector paths give the same bits, and the scalar path (whose SiLU takes std::exp) the same greedy tokens
    on this model; engines on each path run in this one process, one after another."""
    tokens = {}
    for path in ops_isas():
        with Engine.from_artifact(tiny_int4, ops_isa=path, threads=2) as engine:
            tokens[path] = [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]
    best = ops_isas()[0]
    for path, got in tokens.items():
        assert got == tokens[best], (path, best)


def test_a_path_the_cpu_lacks_is_refused_naming_the_offered_ones(tiny_int4):
    with pytest.raises(OpsLibraryError, match=r"ops_isa 'sse9' is not a kernel path of this CPU and build; choose one "
                                              r"of .*scalar"):
        Engine.from_artifact(tiny_int4, ops_isa="sse9")
    with pytest.raises(ConfigError, match="ops_isa must be a kernel path's name"):
        Engine.from_artifact(tiny_int4, ops_isa="")
