"""QLinear's LoRA and the order of the rows: the engine feeds a step's rows sorted by adapter slot
(runtime/model_runner.py), so a token tile holds one adapter; each row's bits must not depend on that order."""
from __future__ import annotations

import numpy as np
import pytest

from tests.custom_ops.test_qlinear import _invariance_case, _rows, run

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

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
