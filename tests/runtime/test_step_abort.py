"""A model run whose rows are mostly cancelled is ended (ORT's RunOptions.terminate) instead of finished, and the
rows that were not cancelled run again with nothing lost: the same greedy tokens as alone, no failed step, every
KV block back. Real sessions on the tiny engine; the cancellation is issued from inside the run it ends."""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_run_ended_for_cancelled_rows_leaves_the_others_exact(tiny_engine, when):
    rng = np.random.default_rng(3)
    keep, drop = rng.integers(3, 512, 6).tolist(), rng.integers(3, 512, 60).tolist()
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        alone = engine.generate([keep], GREEDY)[0].token_ids
        runner, real_run, real_execute = engine.runner, engine.runner._run, engine.runner.execute
        state = {"seqs": [], "ended": False}

        def execute(seqs, *a, **kw):
            state["seqs"] = seqs
            return real_execute(seqs, *a, **kw)

        def run():
            """Cancel "drop" from inside a run of it: at its prefill, or once it decodes (chained steps)."""
            req = engine.scheduler.get_request("drop")
            ours = [s for s in state["seqs"] if s.req_id == "drop"]
            due = ours and (ours[0].num_tokens > 1 if when == "prefill"
                            else req is not None and len(req.token_ids) - req.num_prompt_tokens >= 5)
            if not due or state["ended"] is not False:
                return real_run()
            engine.cancel("drop")              # half or more of this run's tokens: ORT must end it
            try:
                real_run()
            except Exception as e:
                state["ended"] = str(e)
                raise
            state["ended"] = "the run was not ended"

        runner.execute, runner._run = execute, run
        h_keep, h_drop = engine.submit(keep, GREEDY), engine.submit(drop, GREEDY, request_id="drop")
        assert h_drop.result(60).finish_reason == "cancelled"
        out = h_keep.result(60)
        stats = engine.stats()
    assert "terminate flag" in state["ended"], state["ended"]
    assert out.finish_reason == "length" and out.token_ids == alone
    assert stats["aborted_steps"] == 1 and stats["failed_steps"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["running"] == 0
