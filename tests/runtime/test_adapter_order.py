"""Rows sorted by adapter inside a step (model_runner.by_adapter): the runner feeds a step's seqs stably sorted by
adapter slot, so each adapter's rows are one run (a QLinear token tile then holds one adapter), and names each seq's
logits and hidden rows where they landed, so outputs come back in the caller's order. Every row's logits are the
same bits as the seq run alone, whatever order its neighbours came in."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.model_runner import by_adapter, fed_starts, hidden_rows, logits_rows
from ortllm.runtime.scheduler import ScheduledSeq
from tests.reference.peft_lora import make_peft_lora

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _seq(n, adapter=None, start=0, blocks=(0,), logits=True, drafts=(), hidden=0):
    return ScheduledSeq(f"r{n}-{adapter}", [5] * n, start, list(blocks), logits, adapter, list(drafts), hidden)


def test_by_adapter_is_a_stable_sort_with_base_rows_first():
    assert by_adapter([]) is None and by_adapter([3]) is None
    assert by_adapter([-1, -1, 0, 0, 2]) is None                      # sorted already: fed as given
    assert by_adapter([0, 1, 0, 1, -1, 1]) == [4, 0, 2, 1, 3, 5]
    assert by_adapter([2, -1, 2, -1]) == [1, 3, 0, 2]


def test_rows_named_where_each_seq_landed():
    """Seqs of 3, 1 (two drafts: three rows), 4 and 2 tokens fed in order [2, 0, 3, 1]: rows 0-3 are seq 2's, 4-6 seq
    0's, 7-8 seq 3's, 9-11 seq 1's; logits and hidden rows stay in the seqs' order."""
    seqs = [_seq(3, hidden=3), _seq(3, drafts=(7, 8)), _seq(4, logits=False), _seq(2, hidden=1)]
    starts = fed_starts(seqs, [2, 0, 3, 1])
    assert starts == [4, 9, 0, 7]
    assert logits_rows(seqs, starts).tolist() == [6, 9, 10, 11, 8]
    assert hidden_rows(seqs, starts) == [4, 5, 6, 8]
    assert logits_rows(seqs).tolist() == [2, 3, 4, 5, 11]              # without starts: the seqs' own order
    assert hidden_rows(seqs) == [0, 1, 2, 11]


@pytest.fixture(scope="module")
def order_art(tiny_int4, tiny_weights, tmp_path_factory, adapted):
    """The tiny model as an int4 engine artifact (QLinear: batch-invariant to the bit, int8 LoRA stacks) with three
    adapters on every target."""
    base = tmp_path_factory.mktemp("order")
    for k, r in enumerate((8, 16, 5)):
        make_peft_lora(tiny_weights, base / f"a{k}", seed=50 + k, r=r, targets=ALL)
    return adapted(tiny_int4, {f"a{k}": base / f"a{k}" for k in range(3)})


def _mixed_step(bs: int) -> list[ScheduledSeq]:
    """A step of prefill chunks (new and continued), decodes and one embedding row, adapters alternating with the
    base: seq i owns KV blocks 1 + 4i .. 4 + 4i."""
    rng = np.random.default_rng(7)
    spec = [(9, "a0", 0), (1, "a1", 0), (17, None, 0), (1, "a0", 0), (5, "a2", 0), (1, None, 0), (12, "a1", 0),
            (1, "a2", 0), (3, "a0", 0)]
    seqs = []
    for i, (n, adapter, _) in enumerate(spec):
        blocks = list(range(1 + 4 * i, 5 + 4 * i))
        start = 0 if n > 1 else 2 * bs + i              # decodes: a context already in their blocks
        seqs.append(ScheduledSeq(f"s{i}", rng.integers(3, 500, n).tolist(), start, blocks, i != 4, adapter,
                                 hidden_rows=n if i == 4 else 0))
    return seqs


def test_mixed_step_rows_equal_each_seq_alone(order_art):
    """The step is fed sorted by adapter (the runner's feed order differs from the seqs'), and its logits, argmax
    and hidden rows equal, bit for bit, those of each seq run alone (one seq a step: nothing to sort)."""
    with Engine.from_artifact(order_art, num_blocks=64, max_adapters_per_batch=3) as engine:
        runner = engine.runner
        slots, failed = engine.adapters.activate(["a0", "a1", "a2"])
        assert not failed
        seqs = _mixed_step(runner.block_size)
        alone_logits, alone_hidden = [], []
        for s in seqs:
            logits = runner.execute([s], slots).copy()
            alone_logits.append(logits)
            alone_hidden.append(runner.hidden.copy())
            assert runner._order is None
        logits = runner.execute(seqs, slots).copy()
        argmax, hidden = runner.argmax.copy(), runner.hidden.copy()
        assert runner._order is not None and runner._order.tolist() != list(range(len(seqs)))
        scored = runner.execute(seqs, slots, all_logits=True)
        plain = runner.execute([replace(seqs[0], adapter=None)], slots).copy()
    want = np.concatenate([x for x in alone_logits if len(x)])
    np.testing.assert_array_equal(logits, want)
    np.testing.assert_array_equal(argmax, np.argmax(want, axis=1))
    np.testing.assert_array_equal(hidden, np.concatenate([h for h in alone_hidden if len(h)]))
    ends = np.cumsum([s.num_tokens for s in seqs]) - 1
    np.testing.assert_array_equal(scored[ends[[i for i, s in enumerate(seqs) if s.needs_logits]]], want)
    assert not np.array_equal(alone_logits[0], plain), "the adapters should change the logits"


def test_decode_steps_feed_each_seq_its_own_token(order_art):
    """execute_steps runs several steps on the bound inputs (fed sorted by adapter) and feeds each step's argmax
    (in the seqs' order) back to its own seq: each seq's tokens equal its tokens decoded alone."""
    with Engine.from_artifact(order_art, num_blocks=64, max_adapters_per_batch=3) as engine:
        runner = engine.runner
        slots, failed = engine.adapters.activate(["a0", "a1", "a2"])
        assert not failed
        rng = np.random.default_rng(11)
        adapters = ["a1", None, "a0", "a2", "a1", "a0", None, "a2"]
        seqs = [ScheduledSeq(f"d{i}", rng.integers(3, 500, 1).tolist(), 20 + i, list(range(1 + 4 * i, 5 + 4 * i)),
                             True, a) for i, a in enumerate(adapters)]
        for i in range(len(seqs)):                         # a context in each seq's blocks
            runner.execute([ScheduledSeq(f"d{i}", rng.integers(3, 500, 20 + i).tolist(), 0, seqs[i].block_ids,
                                         False, adapters[i])], slots)
        alone = [runner.execute_steps([s], slots, 4)[:, 0] for s in seqs]
        together = runner.execute_steps(seqs, slots, 4)
        assert runner._order is not None
    np.testing.assert_array_equal(together, np.stack(alone, axis=1))
    assert len({tuple(a) for a in alone}) > 1
