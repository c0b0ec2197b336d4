"""The handle is the caller's side of a request (runtime/request_output.py): its deltas, read one by one or delivered
into a queue the caller shares between several handles (as service/lifecycle.py's Call does), add up to its
result; the engine-side state stays in the output processor. Real sessions on the tiny engine."""
from __future__ import annotations

import queue

import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1)


def test_deltas_delivered_into_one_queue_add_up_to_each_result(tiny_engine):
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        alone = engine.generate(["a b c d", "e f"], GREEDY)
        late = engine.submit("e f", GREEDY)
        late.result(60)                               # finished before it is forwarded: its deltas move too
        handles = engine.submit_n("a b c d", GREEDY, 2) + [late]
        q: queue.Queue = queue.Queue()
        for i, h in enumerate(handles):
            h.deliver_to(q, i)
        texts, ends = ["", "", ""], [None, None, None]
        while None in ends:
            i, d = q.get(timeout=60)
            assert ends[i] is None, "a delta after the last one"
            texts[i] += d.text
            ends[i] = d.finish_reason
        outs = [h.result(1) for h in handles]
        with pytest.raises(RuntimeError, match="deliver_to"):
            handles[0].next_delta(timeout=0)
    assert ends == ["length"] * 3 and texts == [o.text for o in outs]
    assert [o.token_ids for o in outs] == [alone[0].token_ids] * 2 + [alone[1].token_ids]
    for h, o in zip(handles, outs):       # what the engine recorded, read through the handle
        assert len(h.token_times) == len(o.token_ids) == len(h.logprobs) == 24
        assert h.submitted <= h.scheduled_time <= h.first_token_time <= h.token_times[-1]
        assert [x.token_id for x in h.logprobs] == o.token_ids


def test_next_delta_times_out_and_iterates_to_the_result(tiny_engine):
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        h = engine.submit([5] * 400, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        text = "".join(h)
        assert h.done and h.result(0).text == text and h.result(0).finish_reason == "length"
        with pytest.raises(RuntimeError, match="already"):
            q: queue.Queue = queue.Queue()
            h.deliver_to(q, 0)
            h.deliver_to(q, 0)
        idle = engine.submit([5], SamplingParams(max_tokens=1, temperature=0.0))
        idle.result(60)
        got = [idle.next_delta(timeout=0) for _ in range(2)]      # its one token's text, then its end
        assert got[0][1] is None and got[1][1] == "length" and got[0][0] + got[1][0] == idle.result(0).text
        with pytest.raises(TimeoutError, match="within 0.01 s"):
            idle.next_delta(timeout=0.01)
