"""QLinear's LoRA schedules (qlinear.cc): by default the shrink and the expand in a phase of their own, the expand
into a [G, T, 8] buffer the projection starts from; with ORTLLM_QLINEAR_LORA_TILES=1 the shrinks inside the
quantization items and the expand inside the projection's tiles (lora_tile: each tile's accumulators start from its
tokens' LoRA on its 8 columns). Both give each row the same bits whatever order the rows come in: sorted by adapter
(the engine's feed order, one adapter a tile) or mixed (several a tile)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.custom_ops.conftest import REPO
from tests.custom_ops.test_qlinear import _invariance_case, _rows, run

pytestmark = pytest.mark.isa_paths   # make test runs these on the AVX2 path too (ci/run_tests.sh)

CASES = [(form, epi) for form in ("int4", "int8") for epi in ("none", "residual", "swiglu")]


def _permuted(extra, perm):
    return {k: (v[perm] if k in ("token_adapter", "residual") else v) for k, v in extra.items()}


@pytest.mark.parametrize("form, epilogue", CASES)
def test_each_row_the_same_bits_sorted_by_adapter_or_mixed(form, epilogue):
    """64 rows over 4 adapters and the base: in their mixed order, sorted by slot (stable, as the runner feeds them)
    and in a random order, each row gets the same bits; sorted, the rows are also each the same as alone."""
    w, x, extra = _invariance_case(epilogue, form)
    mixed = run(w, x, epilogue, **extra)
    ta = extra["token_adapter"]
    assert len(set(ta[:4].tolist())) > 1, "the case should mix adapters inside a tile"
    for perm in (np.argsort(ta, kind="stable"), np.random.default_rng(5).permutation(len(x))):
        got = run(w, x[perm], epilogue, **_permuted(extra, perm))
        np.testing.assert_array_equal(got, mixed[perm])
    order = np.argsort(ta, kind="stable")
    for t in order[::9]:
        alone = run(w, x[t:t + 1], epilogue, threads=1, **_rows(extra, slice(t, t + 1)))
        np.testing.assert_array_equal(alone[0], mixed[t])


_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {repo!r})
from tests.custom_ops.test_qlinear_lora_tiles import CASES, outputs
print(json.dumps(outputs()))
"""


def outputs() -> dict[str, str]:
    """Each case's outputs, rows mixed and sorted by adapter, as hex."""
    out = {}
    for form, epi in CASES:
        w, x, extra = _invariance_case(epi, form)
        perm = np.argsort(extra["token_adapter"], kind="stable")
        out[f"{form}-{epi}-mixed"] = run(w, x, epi, **extra).tobytes().hex()
        out[f"{form}-{epi}-sorted"] = run(w, x[perm], epi, **_permuted(extra, perm)).tobytes().hex()
    return out


def test_expand_in_tiles_equals_the_expand_into_the_buffer():
    """ORTLLM_QLINEAR_LORA_TILES=1 (shrinks in the quantization items, the expand in the tiles) gives the same bits
    as the default schedule, rows mixed or sorted by adapter: the integer sums are exact, and the float steps are the
    same multiplies in the same order."""
    script = _SCRIPT.format(repo=str(REPO))
    res = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, ORTLLM_QLINEAR_LORA_TILES="1"),
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout) == outputs()
