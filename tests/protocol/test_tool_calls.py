"""protocol/tool_calls.py: a reply read as it is generated, however the text is split into deltas."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ortllm.protocol.tool_calls import ToolCallParser

NAMES = ("get_time", "get_weather")

# (reply, calls as (name, arguments text), content)
CASES = [
    ('{"name":"get_time","arguments":{"zone":"Asia/Tokyo"}}', [("get_time", '{"zone":"Asia/Tokyo"}')], ""),
    (' <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>{"name":"get_time","arguments":{}}</tool_call>',
     [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")], ""),
    ('{"arguments":{"zone":"y"},"name":"get_time"}', [("get_time", '{"zone":"y"}')], ""),
    ('{"name":"get_time","arguments":{"a":[1,{"b":"}\\"{"}],"c":true}}',
     [("get_time", '{"a":[1,{"b":"}\\"{"}],"c":true}')], ""),
    ('<tool_call>{"name":"get_time","arguments":{"zone":"X"}}</tool_call> Done.', [("get_time", '{"zone":"X"}')],
     " Done."),
    ("Hello there", [], "Hello there"),
    ('{"city": "Paris"}', [], '{"city": "Paris"}'),                      # JSON, but not a call
    ('{"name":"launch","arguments":{}}', [], '{"name":"launch","arguments":{}}'),   # not a declared tool
    ('{"name":"get_time","arguments":"now"}', [], '{"name":"get_time","arguments":"now"}'),
    ('{"name":"get_time"}', [], '{"name":"get_time"}'),
    ("<tool", [], "<tool"),
    ("", [], ""),
    ('{"name":"get_time","arguments":{"zone":"Asi', [("get_time", '{"zone":"Asi')], ""),   # cut off: max_tokens
]


def _read(text: str, cuts: list[int]) -> tuple[ToolCallParser, list[dict]]:
    p = ToolCallParser(NAMES, "r")
    events, last = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        events += p.feed(text[last:c])
        last = c
    return p, events + p.finish()


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(CASES), data=st.data())
def test_any_split_reads_the_same(case, data):
    """Whatever the deltas: the same calls and content, and the events add up to them (what a client that
    accumulates deltas, like the openai library, ends with)."""
    text, calls, content = case
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    p, events = _read(text, cuts)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in p.calls] == calls
    assert p.content == content == "".join(e.get("content", "") for e in events)
    acc: dict[int, dict] = {}
    for e in events:
        for d in e.get("tool_calls", []):
            if d["index"] not in acc:          # the first delta of a call carries id, type and name
                assert set(d) == {"index", "id", "type", "function"} and d["function"]["arguments"] == ""
                acc[d["index"]] = {"id": d["id"], "name": d["function"]["name"], "arguments": ""}
            else:                              # later ones only the index and an arguments fragment
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                assert d["function"]["arguments"]
                acc[d["index"]]["arguments"] += d["function"]["arguments"]
    assert [(a["name"], a["arguments"]) for _, a in sorted(acc.items())] == calls
    assert [a["id"] for _, a in sorted(acc.items())] == [f"call_r_{i}" for i in range(len(calls))]


@pytest.mark.parametrize("case", [0, 1, 2, 3])
def test_arguments_go_out_as_generated(case):
    """Fed a character at a time, each character of the arguments is its own fragment, as soon as it arrives;
    arguments written before the name wait for it and go out in one piece."""
    text, calls, _ = CASES[case]
    _, events = _read(text, list(range(len(text))))
    fragments = [d["function"]["arguments"] for e in events for d in e.get("tool_calls", []) if "id" not in d]
    if case == 2:
        assert fragments == [calls[0][1]]
    else:
        assert fragments == [ch for _, args in calls for ch in args]


def test_message_and_finish_reason():
    p, _ = _read(CASES[0][0], [5])
    assert p.message() == {"role": "assistant", "content": None, "tool_calls": p.calls}
    assert p.finish_reason("stop") == "tool_calls" and p.finish_reason("length") == "length"
    p, _ = _read("plain text", [])
    assert p.message() == {"role": "assistant", "content": "plain text"} and p.finish_reason("stop") == "stop"
