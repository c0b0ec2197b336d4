"""`ortllm batch` on a real engine: 200 mixed lines give the service's answers; error lines never stop the job."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from ortllm.batch import BatchOptions, run_batch
from ortllm.service.config import ServiceConfig
from tests.batch.conftest import BAD, PAST_CONTEXT, assert_same, comparable, mixed_lines, read_output, write_lines
from tests.service.conftest import start_live, stop_live


def test_200_mixed_lines_equal_the_service(batch_artifact, tmp_path):
    lines = mixed_lines(200)
    src = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    summary = run_batch(batch_artifact, src, out, BatchOptions(max_num_seqs=16, progress=False))

    got = read_output(out)
    by_id = {x["id"]: x for x in got}
    assert len(got) == len(by_id) == 200                         # one line per input line, none twice
    assert set(by_id) == {f"batch_req_{i + 1}" for i in range(200)}
    assert summary.errors == len(BAD) and summary.ok == 200 - len(BAD) and summary.skipped == 0
    assert summary.completion_tokens == sum(x["response"]["body"]["usage"]["completion_tokens"]
                                            for x in got if x["error"] is None)

    for i, (what, status, code) in BAD.items():
        line = by_id[f"batch_req_{i + 1}"]
        assert line["error"] is not None, what
        if code is not None:
            assert line["error"]["code"] == code, (what, line)
        if status is None:
            assert line["response"] is None, what
        else:
            assert line["response"]["status_code"] == status, (what, line)
    assert by_id["batch_req_66"]["custom_id"] == "req-3" and by_id["batch_req_78"]["custom_id"] is None
    # max_tokens 100000 past the context: capped to the room left (llama-tiny-random: 512), as the service does
    capped = by_id[f"batch_req_{PAST_CONTEXT + 1}"]["response"]["body"]
    usage = capped["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 512
    assert capped["choices"][0]["finish_reason"] == "length"

    live = start_live(batch_artifact, ServiceConfig(health_error_window_s=1.0, http_threads=32))
    try:
        def post(i: int):
            obj = json.loads(lines[i])
            r = live.post(obj["url"], json=obj["body"])
            return r.status_code, r.json()

        # every line the service could answer (a stream it would answer as SSE; a batch refuses it)
        todo = [i for i in range(200)
                if by_id[f"batch_req_{i + 1}"]["response"] is not None and BAD.get(i, ("",))[0] != "stream"]
        with ThreadPoolExecutor(16) as pool:
            served = dict(zip(todo, pool.map(post, todo)))
    finally:
        stop_live(live)

    assert len(served) >= 190
    for i, (status, body) in served.items():
        resp = comparable(by_id[f"batch_req_{i + 1}"])["response"]
        assert resp["status_code"] == status, (i, resp, body)
        if status == 200:
            body.pop("created")
            # the body is the service's except for its id (cmpl-<request id>): text, finish_reason, usage,
            # logprobs, model, object, all equal
            # cached tokens report the prefix cache's state, which differs between the two engines' histories
            # (comparable() drops them from the batch line)
            body["usage"].pop("prompt_tokens_details", None)
            assert_same({**resp["body"], "id": None}, {**body, "id": None}, f"line {i}")
        else:
            assert resp["body"] == body, i


def test_rerun_skips_done_lines_and_repairs_a_torn_tail(batch_artifact, tmp_path):
    lines = mixed_lines(40, seed=1)
    src = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    run_batch(batch_artifact, src, out, BatchOptions(progress=False))
    full = {x["id"]: comparable(x) for x in read_output(out)}

    kept = out.read_bytes().splitlines(keepends=True)[:15]
    out.write_bytes(b"".join(kept) + b'{"id": "batch_req_9", "custom_id": "re')       # killed mid-line
    summary = run_batch(batch_artifact, src, out, BatchOptions(progress=False))
    again = read_output(out)
    assert summary.skipped == 15 and summary.ok + summary.errors == 25
    assert_same({x["id"]: comparable(x) for x in again}, full)
    assert len(again) == 40

    summary = run_batch(batch_artifact, src, out, BatchOptions(progress=False))
    assert summary.skipped == 40 and summary.ok + summary.errors == 0 and len(read_output(out)) == 40
