"""The output file's crash safety and resume bookkeeping, and input line checks (no engine)."""
from __future__ import annotations

import json

import pytest

from ortllm.batch.output import BatchFileError, ResultWriter, repair_and_scan
from ortllm.batch.protocol import LineItem, parse_line
from ortllm.batch.runner import bucket
from ortllm.batch.source import read_items

OK = {"id": "batch_req_1", "custom_id": "a", "response": {"status_code": 200, "body": {}}, "error": None}


def _line(**kw) -> bytes:
    return (json.dumps({**OK, **kw}) + "\n").encode()


@pytest.mark.parametrize("tail", [b'{"id": "batch_req_3", "cust', b'{"id": "batch_req_3"}garbage\n', b"\x00\x00\n"])
def test_a_torn_last_line_is_truncated(tmp_path, tail):
    out = tmp_path / "out.jsonl"
    good = _line() + _line(id="batch_req_2", custom_id="b")
    out.write_bytes(good + tail)
    done = repair_and_scan(out)
    assert out.read_bytes() == good
    assert done.custom_ids == {"a", "b"} and done.lines == 2


def test_only_line_torn(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": "batch_')
    assert repair_and_scan(out).lines == 0 and out.read_bytes() == b""


def test_a_bad_line_before_the_last_stops_the_job(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(_line() + b"not json\n" + _line(id="batch_req_3", custom_id="c"))
    with pytest.raises(BatchFileError, match="line 2"):
        repair_and_scan(out)


def test_writer_appends_whole_lines(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(_line())
    with ResultWriter(out, fsync_every=2) as w:
        for k in range(5):
            w.write({**OK, "id": f"batch_req_{k + 2}", "custom_id": f"c{k}", "text": "é\n"})
    lines = out.read_bytes().splitlines()
    assert len(lines) == 6 and json.loads(lines[-1])["text"] == "é\n"


def test_parse_line_errors():
    seen: set[str] = set()
    ok = parse_line(1, json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}), seen)
    assert isinstance(ok, LineItem) and ok.kind == "completions" and seen == {"a"}
    cases = {
        "[1, 2": "invalid_json",
        "[1, 2]": "invalid_json",
        '{"custom_id": NaN}': "invalid_json",
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}): "missing_custom_id",
        json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}): "duplicate_custom_id",
        json.dumps({"custom_id": "b", "method": "PUT", "url": "/v1/completions", "body": {}}): "invalid_method",
        json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}}): "invalid_url",
        json.dumps({"custom_id": "d", "method": "POST", "url": "/v1/completions", "body": "x"}): "invalid_json",
    }
    for text, code in cases.items():
        line = parse_line(7, text, seen)
        assert isinstance(line, dict) and line["error"]["code"] == code and line["id"] == "batch_req_7", text


def test_resume_keys_duplicates_by_line(tmp_path):
    """A repeated custom_id's error line is tracked by its line, so its first line is still run on resume."""
    src = tmp_path / "in.jsonl"
    rows = [{"custom_id": c, "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}} for c in "aab"]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    out = tmp_path / "out.jsonl"
    dup = parse_line(2, json.dumps(rows[1]), {"a"})
    out.write_bytes((json.dumps(dup) + "\n").encode())
    left = list(read_items(src, repair_and_scan(out)))
    assert [x.custom_id for x in left] == ["a", "b"]


def test_length_buckets():
    assert [bucket(n) for n in (1, 16, 17, 32, 33, 1000)] == [4, 4, 5, 5, 6, 10]
