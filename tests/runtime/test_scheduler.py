"""Scheduler tests without a model: a fake runner returns one token per logits row."""
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from ortllm.runtime.config import CacheConfig, SchedulerConfig
from ortllm.runtime.errors import Overloaded, PromptTooLong, RequestError
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.runtime.scheduler import ModelRunnerOutput, RequestStatus, Scheduler
from ortllm.runtime.speculative import accept

EOS = 0


def make(max_batch_tokens=64, max_num_seqs=8, num_blocks=64, block_size=4, prefix=True, **kw):
    """A scheduler with speculative drafts on (spec_max_tokens=8), at any batch size, unless kw says otherwise."""
    extra = {k: kw.pop(k) for k in ("is_resident", "clock") if k in kw}
    kw.setdefault("spec_max_tokens", 8)
    kw.setdefault("spec_max_batch", max_num_seqs)
    cfg = SchedulerConfig(max_batch_tokens=max_batch_tokens, max_num_seqs=max_num_seqs, **kw)
    cache = CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_cache=prefix)
    return Scheduler(cfg, cache, eos_token_ids=[EOS], **extra)


def token_for(req_id, pos):
    """Deterministic 'model': the next token depends on the request and position only (never EOS)."""
    return 1000 + (sum(map(ord, req_id)) * 31 + pos) % 5000


def fake_runner(out, token=token_for):
    """The model's token after each logits row: one per seq, or for k drafts the k + 1 rows' tokens, accepted
    as the engine does (the drafts while they agree, then the model's own token). With out.decode_steps = k > 1
    (every seq a greedy decode): k steps, step j giving each seq the token after position start + j, ending
    after a step in which a seq gave EOS (as the engine's runner does)."""
    res = {}
    if out.decode_steps > 1:
        for j in range(out.decode_steps):
            for s in out.seqs:
                res.setdefault(s.req_id, []).append(token(s.req_id, s.start_pos + 1 + j))
            if any(t[-1] == EOS for t in res.values()):
                break
        return ModelRunnerOutput(res)
    for s in out.seqs:
        if s.needs_logits:
            k, end = len(s.spec_token_ids), s.start_pos + s.num_tokens
            res[s.req_id] = accept(s.spec_token_ids, [token(s.req_id, end - k + j) for j in range(k + 1)])
    return ModelRunnerOutput(res)


def check_step(sched, out, decoding_before):
    """Invariants of one SchedulerOutput against the scheduler state."""
    cfg, bs, pool = sched.config, sched.block_size, sched.pool
    assert out.total_num_scheduled_tokens == sum(s.num_tokens for s in out.seqs) <= cfg.max_batch_tokens
    assert out.num_scheduled_tokens == {s.req_id: s.num_tokens for s in out.seqs}
    assert len(out.seqs) == len({s.req_id for s in out.seqs}) <= cfg.max_num_seqs
    assert len(out.adapters) <= cfg.max_adapters_per_batch
    # all running sequences together stay under the cap, so pinning their adapters needs <= cap slots
    assert len({r.params.adapter for r in sched.running} - {None}) <= cfg.max_adapters_per_batch
    drafted = any(s.spec_token_ids for s in out.seqs)
    decode_rows = sum(1 for s in out.seqs if s.num_tokens - len(s.spec_token_ids) == 1 and s.req_id in decoding_before)
    if decode_rows > cfg.spec_max_batch:   # prompt-lookup drafts only in small steps; a grammar's at any size
        assert all(sched.requests[s.req_id].params.guide is not None for s in out.seqs if s.spec_token_ids)
    for s in out.seqs:
        req = sched.requests[s.req_id]
        k, fed = len(s.spec_token_ids), s.num_tokens - len(s.spec_token_ids)   # drafts, verified tokens fed
        assert req.status is RequestStatus.RUNNING and s.start_pos == req.num_computed_tokens
        assert s.num_tokens >= 1 and len(s.block_ids) * bs >= s.start_pos + s.num_tokens
        assert 0 not in s.block_ids and s.block_ids == req.block_ids
        assert s.needs_logits == (s.start_pos + fed == req.num_tokens)
        assert s.token_ids[:fed] == req.token_ids[s.start_pos:s.start_pos + fed]
        if k:   # drafts: only on a decode row, within max_tokens (with the target's own token); a guided row's
            # are its grammar's forced tokens, never prompt lookup's
            assert fed == 1 and s.needs_logits
            if req.params.guide is None:
                assert req.spec is not None and not req.forced_token_ids
            else:
                assert req.spec is None and s.spec_token_ids == req.forced_token_ids[:k]
            assert req.num_tokens - req.num_prompt_tokens + k + 1 <= req.params.max_tokens
        elif drafted and s.req_id not in decoding_before:
            # drafts only take what is left: no prefill chunk in a step with drafts was cut by the budget
            assert s.num_tokens == min(req.num_tokens - s.start_pos, cfg.prefill_chunk)
    if out.decode_steps > 1:   # multi-step: greedy one-token decodes only, blocks for every step, within max_tokens
        for s in out.seqs:
            req = sched.requests[s.req_id]
            assert s.num_tokens == 1 and not s.spec_token_ids and s.needs_logits and req.params.greedy
            assert len(s.block_ids) * bs >= s.start_pos + out.decode_steps
            assert req.num_tokens - req.num_prompt_tokens + out.decode_steps <= req.params.max_tokens
    # decodes first, and never stalled: every sequence that was decoding is scheduled unless preempted
    kinds = [s.num_tokens - len(s.spec_token_ids) == 1 and s.req_id in decoding_before for s in out.seqs]
    assert kinds == sorted(kinds, reverse=True)
    scheduled = {s.req_id for s in out.seqs}
    for rid in decoding_before:
        assert rid in scheduled or rid in out.preempted_req_ids or rid in out.finished
    # refcounts equal the number of block tables holding each block; nothing leaked
    pool.check_invariants()
    held = Counter(b for r in sched.running for b in r.block_ids)
    assert all(pool.ref_count(b) == held.get(b, 0) for b in range(1, pool.num_blocks))
    assert not any(r.block_ids for r in sched.waiting)


def run(sched, max_steps=5000, runner=fake_runner, before_step=None):
    outs = []
    while sched.has_unfinished_requests():
        assert len(outs) < max_steps, "no progress"
        if before_step:
            before_step(sched, len(outs))
        decoding = {r.req_id for r in sched.running if r.num_tokens - r.num_computed_tokens == 1}
        out = sched.schedule()
        check_step(sched, out, decoding)
        outs.append(out)
        sched.update_from_output(out, runner(out))
    assert sched.pool.num_free == sched.pool.num_usable
    return outs


def expected_tokens(req):
    return [token_for(req.req_id, req.num_prompt_tokens + i) for i in range(req.params.max_tokens)]


def test_prefill_then_decode():
    s = make()
    r = s.add_request("a", list(range(1, 11)), SamplingParams(max_tokens=5))
    outs = run(s)
    assert [o.total_num_scheduled_tokens for o in outs] == [10, 1, 1, 1, 1]
    assert outs[0].seqs[0].needs_logits and outs[0].seqs[0].start_pos == 0
    assert r.output_token_ids == expected_tokens(r) and r.finish_reason == "length"
    assert s.stats().num_running == 0


def test_updates_report_tokens_and_finish():
    s = make()
    s.add_request("a", [5, 6], SamplingParams(max_tokens=2))
    ups = s.update_from_output(out := s.schedule(), fake_runner(out))
    assert [(u.req_id, len(u.new_token_ids), u.finish_reason) for u in ups] == [("a", 1, None)]
    ups = s.update_from_output(out := s.schedule(), fake_runner(out))
    assert ups[0].finish_reason == "length" and not s.has_unfinished_requests()


def test_chunked_prefill_never_stalls_decodes():
    s = make(max_batch_tokens=16, max_num_seqs=4, num_blocks=80)
    a = s.add_request("a", [1, 2, 3], SamplingParams(max_tokens=30))
    s.update_from_output(out := s.schedule(), fake_runner(out))
    b = s.add_request("b", list(range(1, 101)), SamplingParams(max_tokens=3))
    outs = run(s)
    prefill_steps = [o for o in outs if any(q.req_id == "b" and not q.needs_logits for q in o.seqs)]
    assert len(prefill_steps) >= 6
    for o in prefill_steps:
        assert o.seqs[0].req_id == "a" and o.seqs[0].num_tokens == 1       # a decodes every step
        assert o.total_num_scheduled_tokens == 16                          # b takes the rest
    assert a.output_token_ids == expected_tokens(a) and b.output_token_ids == expected_tokens(b)


def test_long_prefill_chunk_caps_one_sequence():
    s = make(max_batch_tokens=32, long_prefill_chunk=8, num_blocks=40)
    s.add_request("a", list(range(1, 30)), SamplingParams(max_tokens=1))
    s.add_request("b", list(range(1, 30)), SamplingParams(max_tokens=1))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 8, "b": 8}


def test_priorities_then_fifo():
    s = make(max_batch_tokens=16, max_num_seqs=1)
    for rid, prio in [("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5), ("mid", 2)]:
        s.add_request(rid, [1, 2], SamplingParams(max_tokens=2, priority=prio))
    outs = run(s)
    firsts = []
    for o in outs:
        firsts += [q.req_id for q in o.seqs if q.start_pos == 0]
    assert firsts == ["high1", "high2", "mid", "low1", "low2"]


def test_preemption_under_memory_pressure_completes_everything():
    # 9 usable blocks of 4 tokens; each request needs up to 5 blocks: only one fits at full length
    s = make(max_batch_tokens=32, num_blocks=10, prefix=False)
    reqs = [s.add_request(f"r{i}", list(range(1, 9)), SamplingParams(max_tokens=12)) for i in range(4)]
    outs = run(s)
    assert s.stats().num_preemptions > 0 and any(o.preempted_req_ids for o in outs)
    for r in reqs:   # the same tokens as an unpressured run: recompute keeps generated tokens
        assert r.output_token_ids == expected_tokens(r) and r.finish_reason == "length"


def test_preempts_youngest():
    s = make(max_batch_tokens=32, num_blocks=7, prefix=False)
    s.add_request("old", [1, 2, 3, 4], SamplingParams(max_tokens=20))
    s.update_from_output(out := s.schedule(), fake_runner(out))
    s.add_request("young", [1, 2, 3, 4], SamplingParams(max_tokens=20))
    preempted = []
    while not preempted:
        out = s.schedule()
        preempted = out.preempted_req_ids
        s.update_from_output(out, fake_runner(out))
    assert preempted == ["young"] and s.get_request("young").status is RequestStatus.WAITING
    run(s)


def test_request_that_can_never_fit_is_rejected():
    s = make(num_blocks=5)                           # 4 usable blocks x 4 tokens = 16 tokens
    with pytest.raises(PromptTooLong, match="prompt has 10 tokens and max_tokens is 8: 18 tokens, but at most 16"):
        s.add_request("x", list(range(1, 11)), SamplingParams(max_tokens=8))
    s2 = make(max_model_len=12)
    with pytest.raises(PromptTooLong, match="max_model_len"):
        s2.add_request("x", list(range(1, 11)), SamplingParams(max_tokens=8))
    assert not s.has_unfinished_requests()


def test_request_validation():
    """The scheduler checks only what it alone knows (the input processor checks the rest:
    tests/runtime/test_request_input.py): a request id in use."""
    s = make()
    s.add_request("dup", [1])
    with pytest.raises(RequestError, match="already in use"):
        s.add_request("dup", [1])


def test_overloaded_when_queue_full():
    s = make(max_queued=2)
    s.add_request("a", [1])
    s.add_request("b", [1])
    with pytest.raises(Overloaded, match="retry later"):
        s.add_request("c", [1])
    assert s.stats().num_waiting == 2 and s.get_request("c") is None


def test_cancel_frees_blocks_at_next_step():
    s = make()
    s.add_request("a", list(range(1, 20)), SamplingParams(max_tokens=50))
    s.add_request("b", list(range(1, 20)), SamplingParams(max_tokens=50))
    s.add_request("queued", [1], SamplingParams(max_tokens=50))
    s.update_from_output(out := s.schedule(), fake_runner(out))
    out = s.schedule()
    used = s.pool.num_usable - s.pool.num_free
    s.finish_requests(["a", "queued", "nope"])
    ups = s.update_from_output(out, fake_runner(out))     # a was cancelled mid-step: its token is dropped
    assert [u.req_id for u in ups] == ["b"]
    assert s.pool.num_usable - s.pool.num_free == used      # freed only at the next step
    assert s.has_unfinished_requests()
    out = s.schedule()
    assert out.finished == {"a": "cancelled", "queued": "cancelled"}
    assert [q.req_id for q in out.seqs] == ["b"] and s.get_request("a") is None
    s.finish_requests("b", "stop")
    assert s.schedule().finished == {"b": "stop"}
    assert s.pool.num_free == s.pool.num_usable and not s.has_unfinished_requests()
    with pytest.raises(ValueError, match="finish reason"):
        s.finish_requests("x", "bored")


def test_eos_and_stop_token_ids():
    s = make()
    a = s.add_request("a", [1, 2], SamplingParams(max_tokens=10))
    b = s.add_request("b", [1, 2], SamplingParams(max_tokens=10, ignore_eos=True))
    c = s.add_request("c", [1, 2], SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=[7]))
    run(s, runner=lambda out: fake_runner(out, lambda rid, pos: EOS if pos == 4 else 7 if pos == 5 else 3))
    assert (a.output_token_ids, a.finish_reason) == ([3, 3, EOS], "stop")
    assert (b.output_token_ids[:4], b.finish_reason) == ([3, 3, EOS, 7], "length")
    assert (c.output_token_ids, c.finish_reason) == ([3, 3, EOS, 7], "stop")


def test_adapter_cap_and_resident_preference():
    resident = {"r1", "r2"}
    s = make(max_batch_tokens=64, max_num_seqs=8, max_adapters_per_batch=2, is_resident=resident)
    for i, name in enumerate(["x1", "x2", "r1", "r2", None, "x1"]):
        s.add_request(f"q{i}", [1, 2, 3], SamplingParams(max_tokens=4, adapter=name))
    assert s.queued_adapters()[:2] == ["r1", "r2"]
    out = s.schedule()
    assert out.adapters == ["r1", "r2"]                       # resident first, base model does not count
    assert sorted(q.req_id for q in out.seqs) == ["q2", "q3", "q4"]
    outs = run(s)
    assert all(len(o.adapters) <= 2 for o in outs)
    assert {q.adapter for o in outs for q in o.seqs} == {"x1", "x2", "r1", "r2", None}


@pytest.mark.parametrize("aging_steps", [3, 1000])
def test_aging_prevents_starvation_by_the_adapter_cap(aging_steps):
    s = make(max_batch_tokens=64, max_num_seqs=8, max_adapters_per_batch=1, aging_steps=aging_steps)
    s.add_request("a0", [1, 2], SamplingParams(max_tokens=4, adapter="a"))
    s.update_from_output(out := s.schedule(), fake_runner(out))
    starved = s.add_request("b", [1, 2], SamplingParams(max_tokens=2, adapter="b"))
    admitted_at = []

    def flood(sched, step):    # a new request for the running adapter every step
        if step < 60:
            sched.add_request(f"a{step + 1}", [1, 2], SamplingParams(max_tokens=4, adapter="a"))
        if starved.status is not RequestStatus.WAITING and not admitted_at:
            admitted_at.append(step)

    run(s, before_step=flood)
    assert starved.finish_reason == "length"
    if aging_steps == 3:
        assert admitted_at[0] < 15
    else:       # without aging the flood for the running adapter holds it back until the flood ends
        assert admitted_at[0] > 60


def test_deadline_expires_waiting_request():
    now = [0.0]
    s = make(max_num_seqs=1, clock=lambda: now[0])
    s.add_request("busy", [1], SamplingParams(max_tokens=10))
    s.add_request("late", [1], SamplingParams(max_tokens=2, deadline_s=1.0))
    s.update_from_output(out := s.schedule(), fake_runner(out))
    now[0] = 2.0
    out = s.schedule()
    assert out.finished == {"late": "deadline"} and s.stats().num_waiting == 0


def test_prefix_cache_hits_and_sharing():
    s = make(max_batch_tokens=64, block_size=4)
    prompt = list(range(1, 18))                               # 17 tokens: 4 full blocks
    a = s.add_request("a", prompt, SamplingParams(max_tokens=3))
    s.update_from_output(out := s.schedule(), fake_runner(out))
    b = s.add_request("b", prompt, SamplingParams(max_tokens=3))
    c = s.add_request("c", prompt[:12] + [99] * 5, SamplingParams(max_tokens=3))
    s.add_request("d", prompt, SamplingParams(max_tokens=3, adapter="sql"))
    out = s.schedule()
    n = out.num_scheduled_tokens
    assert n["a"] == 1 and n["b"] == 1 and n["c"] == 5 and n["d"] == 17   # adapter changes the hash
    assert b.block_ids[:4] == a.block_ids[:4] and c.block_ids[:3] == a.block_ids[:3]
    assert all(s.pool.ref_count(x) == 3 for x in a.block_ids[:3])
    st_ = s.stats()
    assert (st_.prefix_cache_queries, st_.prefix_cache_hits) == (17 * 4, 16 + 12)
    s.update_from_output(out, fake_runner(out))
    run(s)
    assert a.output_token_ids == expected_tokens(a) and b.output_token_ids == expected_tokens(b)
    # after everything finished the blocks stay cached (evictable), all free
    assert s.pool.num_cached > 0 and s.pool.num_free == s.pool.num_usable
    e = s.add_request("e", prompt[:16], SamplingParams(max_tokens=1))
    assert s.schedule().num_scheduled_tokens == {"e": 4}      # last token recomputed: 3 blocks hit
    assert 0 < s.stats().prefix_cache_hit_rate < 1 and e.num_computed_tokens == 12


def test_generated_blocks_are_cached_too():
    s = make(max_batch_tokens=64, block_size=4)
    a = s.add_request("a", [1, 2, 3], SamplingParams(max_tokens=6))
    run(s)
    b = s.add_request("b", a.token_ids[:8] + [5], SamplingParams(max_tokens=1))
    assert s.schedule().num_scheduled_tokens == {"b": 1} and b.num_computed_tokens == 8


def test_prefix_cache_off():
    s = make(prefix=False)
    s.add_request("a", list(range(1, 18)), SamplingParams(max_tokens=1))
    run(s)
    s.add_request("b", list(range(1, 18)), SamplingParams(max_tokens=1))
    assert s.schedule().num_scheduled_tokens == {"b": 17} and s.stats().prefix_cache_queries == 0


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_workloads_finish_without_leaks(data):
    """Random add / cancel / step events under random budgets and pool sizes: every block comes back,
    the budget holds every step, refcounts stay >= 0, every request ends with the right token count and
    exactly the model's tokens. The 'periodic' model repeats itself with occasional detours, so prompt-lookup
    drafts are proposed, accepted, partly rejected (rolled back) and cut by EOS; 'counting' never repeats."""
    periodic = data.draw(st.booleans())
    period = data.draw(st.integers(2, 7))

    def model(rid, pos):
        h = sum(map(ord, rid))
        if (h * 7 + pos) % 23 == 0:
            return EOS
        if not periodic:
            return 1 + pos
        return 60 + pos % 3 if (h + pos * 7) % 13 == 0 else 1 + pos % period

    bs = data.draw(st.sampled_from([2, 4, 8]))
    max_seqs = data.draw(st.integers(1, 6))
    budget = data.draw(st.integers(max(bs, max_seqs), 48))
    s = make(max_batch_tokens=budget, max_num_seqs=max_seqs, block_size=bs,
             num_blocks=data.draw(st.integers(4, 40)), prefix=data.draw(st.booleans()),
             max_adapters_per_batch=data.draw(st.integers(1, 3)), aging_steps=data.draw(st.integers(1, 5)),
             long_prefill_chunk=data.draw(st.one_of(st.none(), st.integers(1, budget))), max_queued=8,
             decode_steps=data.draw(st.sampled_from([1, 2, 4])))
    shared = data.draw(st.lists(st.integers(1, 9), min_size=4, max_size=16))   # common prefix: cache hits
    reqs, cancelled = [], set()
    kinds = st.sampled_from(["add", "add", "add", "cancel", "step", "step"])
    events = data.draw(st.lists(kinds, min_size=20, max_size=80))

    def step():
        decoding = {r.req_id for r in s.running if r.num_tokens - r.num_computed_tokens == 1}
        out = s.schedule()
        check_step(s, out, decoding)
        s.update_from_output(out, fake_runner(out, model))

    for ev in events:
        if ev == "add":
            prompt = shared[:data.draw(st.integers(0, len(shared)))] + data.draw(
                st.lists(st.integers(1, 9), min_size=1, max_size=20))
            params = SamplingParams(max_tokens=data.draw(st.integers(1, 24)),
                                    temperature=data.draw(st.sampled_from([0.0, 1.0])),   # greedy: multi-step
                                    adapter=data.draw(st.sampled_from([None, "a", "b", "c"])),
                                    priority=data.draw(st.integers(0, 2)), speculative=data.draw(st.booleans()))
            try:
                reqs.append(s.add_request(f"r{len(reqs)}", prompt, params))
            except PromptTooLong:
                assert len(prompt) + params.max_tokens > s.pool.num_usable * bs
            except Overloaded:
                assert len(s.waiting) >= 8
        elif ev == "cancel" and reqs:
            victim = data.draw(st.sampled_from(reqs))
            s.finish_requests(victim.req_id)
            cancelled.add(victim.req_id)
        elif ev == "step":
            step()
    for _ in range(2000):
        if not s.has_unfinished_requests():
            break
        step()
    assert not s.has_unfinished_requests(), "requests left unfinished after 2000 steps"
    assert s.pool.num_free == s.pool.num_usable
    s.pool.check_invariants()
    st_ = s.stats()
    assert st_.spec_accepted <= st_.spec_drafted
    for r in reqs:
        assert r.status is RequestStatus.FINISHED
        out = r.output_token_ids
        assert out == [model(r.req_id, r.num_prompt_tokens + i) for i in range(len(out))]
        if r.finish_reason == "length":
            assert len(out) == r.params.max_tokens and EOS not in out
        elif r.finish_reason == "stop":
            assert out[-1] == EOS and EOS not in out[:-1] and len(out) <= r.params.max_tokens
        else:
            assert r.finish_reason == "cancelled" and r.req_id in cancelled and len(out) < r.params.max_tokens


# ---- multi-step decoding (decode_steps) ----

def greedy(n=10, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def test_multi_step_plans_k_steps_and_takes_their_tokens():
    s = make(block_size=4, spec_max_tokens=0, decode_steps=4)
    s.add_request("a", [5, 6, 7, 8, 9], greedy(10))
    out = s.schedule()
    assert out.decode_steps == 1                          # a prefill step
    s.update_from_output(out, fake_runner(out))
    steps = []
    while s.has_unfinished_requests():
        out = s.schedule()
        check_step(s, out, {"a"})
        steps.append(out.decode_steps)
        seq = out.seqs[0]
        assert len(seq.block_ids) == -(-(seq.start_pos + out.decode_steps) // 4)   # blocks for every step
        (u,) = s.update_from_output(out, fake_runner(out))
        assert len(u.new_token_ids) == out.decode_steps
    assert steps == [4, 4, 1]                             # 1 + 4 + 4 + 1 = max_tokens: never past it
    req = s.requests.get("a")
    assert req is None and s.pool.num_free == s.pool.num_usable


def test_multi_step_ended_early_frees_the_blocks_of_the_steps_not_run():
    s = make(block_size=2, spec_max_tokens=0, decode_steps=4, prefix=False)
    req = s.add_request("a", [5, 6, 7], greedy(20))
    out = s.schedule()
    s.update_from_output(out, fake_runner(out))
    out = s.schedule()
    assert out.decode_steps == 4 and len(req.block_ids) == 4      # positions 3..6 written: 7 tokens, 4 blocks
    (u,) = s.update_from_output(out, ModelRunnerOutput({"a": [11, 12]}))   # the runner stopped after 2 steps
    assert u.new_token_ids == [11, 12] and req.output_token_ids == [token_for("a", 3), 11, 12]
    assert req.num_computed_tokens == 5 and len(req.block_ids) == 3     # the next token (position 5) fits
    out = s.schedule()
    assert out.seqs[0].token_ids == [12] and out.seqs[0].start_pos == 5
    with pytest.raises(ValueError, match="1 to 4 tokens"):
        s.update_from_output(out, ModelRunnerOutput({"a": [1, 2, 3, 4, 5]}))


def test_multi_step_stops_at_eos_inside_the_steps():
    s = make(block_size=4, spec_max_tokens=0, decode_steps=4)
    req = s.add_request("a", [5, 6, 7], greedy(20))
    out = s.schedule()
    s.update_from_output(out, fake_runner(out))
    out = s.schedule()
    (u,) = s.update_from_output(out, ModelRunnerOutput({"a": [11, EOS, 13, 14]}))
    assert u.new_token_ids == [11, EOS] and u.finish_reason == "stop"
    assert req.status is RequestStatus.FINISHED and s.pool.num_free == s.pool.num_usable


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=10, temperature=0.7), greedy(logprobs=2),
                                    greedy(repetition_penalty=1.2), greedy(logit_bias={3: 1.0})],
                         ids=["sampled", "logprobs", "penalty", "logit_bias"])
def test_multi_step_only_for_raw_argmax_rows(params):
    s = make(block_size=4, spec_max_tokens=0, decode_steps=4)
    s.add_request("plain", [5, 6, 7], greedy())
    s.add_request("other", [5, 6, 8], params)
    for _ in range(3):
        out = s.schedule()
        assert out.decode_steps == 1
        s.update_from_output(out, fake_runner(out))


def test_multi_step_waits_for_prefills_and_free_blocks():
    s = make(block_size=4, spec_max_tokens=0, decode_steps=4, prefix=False)
    s.add_request("a", [5, 6, 7], greedy(8))
    out = s.schedule()
    s.update_from_output(out, fake_runner(out))
    s.add_request("b", [5, 6], greedy(8))
    out = s.schedule()                      # a's decode beside b's prefill: one step
    assert out.decode_steps == 1 and {q.req_id for q in out.seqs} == {"a", "b"}
    s.update_from_output(out, fake_runner(out))
    assert s.schedule().decode_steps == 4   # both decoding now

    s = make(block_size=4, spec_max_tokens=0, decode_steps=4, num_blocks=3, prefix=False)   # 2 usable blocks
    s.add_request("a", [5, 6, 7], greedy(5))
    s.add_request("b", [5, 6, 8], greedy(5))
    out = s.schedule()
    s.update_from_output(out, fake_runner(out))
    out = s.schedule()                      # 4 steps would need a block each; none is free: one step, none taken
    assert out.decode_steps == 1 and s.pool.num_free == 0 and all(len(q.block_ids) == 1 for q in out.seqs)


# ---- speculative decoding (prompt-lookup drafts) ----

def periodic(rid, pos, period=5):
    """A 'model' that repeats itself, with a detour every 11th position: drafts are accepted and rejected."""
    return 70 if pos % 11 == 0 else 1 + pos % period


def test_drafts_are_verified_and_rolled_back():
    s = make(max_batch_tokens=64, block_size=4, num_blocks=64)
    a = s.add_request("a", [1, 2, 3, 4, 5, 1, 2], SamplingParams(max_tokens=40))
    b = s.add_request("b", [1, 2, 3, 4, 5, 1, 2], SamplingParams(max_tokens=40, speculative=False))
    outs = run(s, runner=lambda out: fake_runner(out, periodic))
    st_ = s.stats()
    assert 0 < st_.spec_accepted < st_.spec_drafted, "drafts were never accepted or never rejected"
    assert any(len(sq.spec_token_ids) > 1 for o in outs for sq in o.seqs)
    assert all(sq.req_id == "a" for o in outs for sq in o.seqs if sq.spec_token_ids)   # b: speculative=False
    want = lambda r: [periodic(r.req_id, r.num_prompt_tokens + i) for i in range(40)]  # noqa: E731
    assert a.output_token_ids == want(a) and b.output_token_ids == want(b)
    assert len(outs) < 40 + 3, "speculation made no step produce more than one token"   # b alone takes 41


def test_prompt_lookup_drafts_stop_above_spec_max_batch():
    """Three decoding sequences with spec_max_batch 2: no prompt-lookup drafts while all three run; once one
    finishes, the other two draft again; the tokens are the model's either way."""
    s = make(max_batch_tokens=64, block_size=4, num_blocks=64, spec_max_batch=2)
    reqs = [s.add_request(f"r{i}", [1, 2, 3, 4, 5, 1, 2], SamplingParams(max_tokens=n))
            for i, n in enumerate((12, 40, 40))]
    outs = run(s, runner=lambda out: fake_runner(out, periodic))
    three = [o for o in outs if sum(1 for sq in o.seqs if sq.num_tokens - len(sq.spec_token_ids) == 1) == 3]
    assert three and not any(sq.spec_token_ids for o in three for sq in o.seqs)
    assert any(sq.spec_token_ids for o in outs[outs.index(three[-1]) + 1:] for sq in o.seqs)
    for r in reqs:
        want = [periodic(r.req_id, r.num_prompt_tokens + i) for i in range(len(r.output_token_ids))]
        assert r.output_token_ids == want


def test_prefix_cache_only_hashes_verified_tokens():
    from ortllm.runtime.block_pool import extend_block_hashes
    s = make(max_batch_tokens=64, block_size=2, num_blocks=64)
    reqs = [s.add_request(f"r{i}", [1, 2, 3, 4, 5, 1, 2, 9 + i], SamplingParams(max_tokens=30)) for i in range(3)]
    run(s, runner=lambda out: fake_runner(out, periodic))
    assert s.stats().spec_drafted > s.stats().spec_accepted > 0
    verified = {h for r in reqs for h in extend_block_hashes([], r.token_ids, 2, None)}
    assert set(s.pool._cached) <= verified


def test_drafts_take_only_leftover_budget():
    """A running decode with drafts available must not take budget from a prompt waiting for admission."""
    s = make(max_batch_tokens=16, block_size=4, num_blocks=64)
    s.add_request("a", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=30))
    out = s.schedule()
    s.update_from_output(out, fake_runner(out, lambda rid, pos: 1 + pos % 3))
    s.add_request("b", list(range(10, 39)), SamplingParams(max_tokens=2))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1, "b": 15} and not out.seqs[0].spec_token_ids
    s.update_from_output(out, fake_runner(out, lambda rid, pos: 1 + pos % 3))
    out = s.schedule()            # b has 14 prompt tokens left: 1 token of budget for a's drafts
    assert out.num_scheduled_tokens == {"a": 2, "b": 14} and out.seqs[0].spec_token_ids


def test_guided_and_off_requests_are_never_drafted():
    from ortllm.runtime.sampling_params import Guide
    s = make()
    g = s.add_request("g", [1, 2, 1, 2, 1], SamplingParams(max_tokens=5, guide=Guide("regex", "a+")))
    off = make(spec_max_tokens=0).add_request("o", [1, 2, 1, 2, 1], SamplingParams(max_tokens=5))
    assert g.spec is None and off.spec is None


def test_forced_tokens_are_next_steps_drafts():
    """ModelRunnerOutput.forced_token_ids (a grammar's forced tokens) are verified as drafts in the next step,
    with prompt-lookup drafts off too: right ones save steps, wrong ones are rolled back, the tokens are the
    model's either way, the budget and max_tokens hold (check_step), nothing leaks (run)."""
    from ortllm.runtime.sampling_params import Guide

    def runner(out, wrong_every=7):
        res = fake_runner(out)
        forced = {}
        for sq in out.seqs:
            if sq.req_id in res.sampled_token_ids:     # the grammar forces the model's next 5 tokens, mostly
                end = sq.start_pos + len(sq.token_ids) - len(sq.spec_token_ids) + len(res.sampled_token_ids[sq.req_id])
                f = [token_for(sq.req_id, end + j) for j in range(5)]
                if end % wrong_every == 0:
                    f[2] += 1
                forced[sq.req_id] = f
        return ModelRunnerOutput(res.sampled_token_ids, forced)

    s = make(spec_max_tokens=0, max_batch_tokens=32)
    g = s.add_request("g", [1, 2, 3], SamplingParams(max_tokens=40, guide=Guide("regex", "a+")))
    outs = run(s, runner=runner)
    st_ = s.stats()
    assert g.output_token_ids == expected_tokens(g) and g.finish_reason == "length"
    assert 0 < st_.forced_accepted < st_.forced_drafted and st_.spec_drafted == 0
    assert len(outs) < 40 // 2, "forced drafts did not save steps"
    # a forced draft never takes budget a prefill needs: a 31-token prompt leaves one token for the drafts
    s = make(spec_max_tokens=0, max_batch_tokens=32)
    s.add_request("g", [1, 2, 3], SamplingParams(max_tokens=40, guide=Guide("regex", "a+")))
    s.update_from_output(out := s.schedule(), runner(out))
    s.add_request("b", list(range(10, 41)), SamplingParams(max_tokens=2))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"g": 1, "b": 31}


def test_adaptive_k_pauses_after_failures_and_recovers():
    from ortllm.runtime.speculative import MISSES_TO_PAUSE, PAUSE_STEPS, AdaptiveK
    k = AdaptiveK(8)
    assert k.current() == 4
    k.record(4, 4)
    assert k.current() == 6
    k.record(6, 2)
    assert k.current() == 3
    for _ in range(MISSES_TO_PAUSE):
        k.record(k.current(), 0)
    assert [k.current() for _ in range(PAUSE_STEPS)] == [0] * PAUSE_STEPS and k.current() == 1
    k.record(1, 0)                                    # the probe fails: a pause twice as long
    assert [k.current() for _ in range(2 * PAUSE_STEPS)] == [0] * (2 * PAUSE_STEPS) and k.current() == 1
    k.record(1, 1)
    assert k.current() == 3 and k.next_pause == PAUSE_STEPS


def test_ngram_index_proposes_what_followed_the_latest_longest_match():
    from ortllm.runtime.speculative import NgramIndex, accept
    idx = NgramIndex(2, 4)
    toks = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 5, 6, 7]
    assert idx.propose(toks, 3) == [8, 9, 1]          # 3-gram 5 6 7 beats the later 2-gram 6 7
    assert idx.propose(toks + [4], 3) == []
    assert NgramIndex(2, 4).propose([1, 2, 1, 2], 5) == [1, 2]    # bounded by the tokens known
    assert accept([4, 5, 6], [4, 5, 9, -1]) == [4, 5, 9] and accept([4], [4, 8]) == [4, 8]
    assert accept([], [3]) == [3] and accept([4, 5], [1, -1, -1]) == [1]
