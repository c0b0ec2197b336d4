"""Each API's renderer, without HTTP: one greedy generation on the tiny engine rendered streamed (the Renderer
calls in the order service/lifecycle.py makes them) and not streamed gives the same text and finish in every
wire format (OpenAI chat, Anthropic Messages, Responses, Ollama)."""
from __future__ import annotations

import json
import time

import pytest

from ortllm.protocol.generation import OpenAIRenderer, prepare, token_text_of
from ortllm.protocol.messages import MessagesRenderer, parse_messages
from ortllm.protocol.ollama import OllamaRenderer
from ortllm.protocol.openai import parse_chat
from ortllm.protocol.rendering import Generation
from ortllm.protocol.responses import ResponsesRenderer, parse_response
from ortllm.runtime.engine import Engine

PROMPT = "Name three colors."


@pytest.fixture(scope="module")
def engine(tiny_engine):
    with Engine.from_artifact(tiny_engine, num_blocks=64) as e:
        yield e


def _generation(engine, req) -> Generation:
    sub = prepare(engine, req, "tiny", several=True)
    handles = engine.submit_n(sub.prompts[0], sub.params, 1, request_id="r1")
    return Generation(req, "r1", "tiny", 0, handles, sub.prompts, time.perf_counter(), token_text_of(engine),
                      lambda p: PROMPT)


def _streamed(r) -> bytes:
    """The renderer's bytes as the lifecycle writes a stream of one choice."""
    h = r.gen.handles[0]
    out = b"".join(r.opening())
    while True:
        delta, finish = h.next_delta(timeout=60)
        out += b"".join(r.delta(0, delta, finish is not None))
        if finish is not None:
            break
    res = h.result(timeout=60)
    return out + b"".join(r.finished(0, res, [res]) + r.closing([res]) + r.trailer())


def _sse_data(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def _chat(body: dict):
    return parse_chat({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "temperature": 0,
                       **body})


CASES = {
    # name: (request parser, renderer, streamed text + finish, body text + finish)
    "openai": (lambda s: (_chat({"stream": s}), None), lambda g, x: OpenAIRenderer(g, "chat"),
               lambda raw: ("".join(c["choices"][0]["delta"].get("content") or "" for c in _sse_data(raw)),
                            _sse_data(raw)[-1]["choices"][0]["finish_reason"]),
               lambda b: (b["choices"][0]["message"]["content"], b["choices"][0]["finish_reason"])),
    "messages": (lambda s: (lambda m: (m.chat, m))(parse_messages(
                     {"model": "tiny", "max_tokens": 12, "temperature": 0, "stream": s,
                      "messages": [{"role": "user", "content": PROMPT}]})),
                 MessagesRenderer,
                 lambda raw: ("".join(e["delta"].get("text", "") for e in _sse_data(raw)
                                      if e["type"] == "content_block_delta"),
                              next(e for e in _sse_data(raw) if e["type"] == "message_delta")["delta"]["stop_reason"]),
                 lambda b: (b["content"][0]["text"], b["stop_reason"])),
    "responses": (lambda s: (lambda rr: (rr.chat, rr))(parse_response(
                      {"model": "tiny", "input": PROMPT, "max_output_tokens": 12, "temperature": 0, "stream": s})),
                  ResponsesRenderer,
                  lambda raw: ("".join(e["delta"] for e in _sse_data(raw) if e["type"] == "response.output_text.delta"),
                               _sse_data(raw)[-1]["response"]["status"]),
                  lambda b: (b["output"][0]["content"][0]["text"], b["status"])),
    "ollama": (lambda s: (_chat({"stream": s}), None), lambda g, x: OllamaRenderer(g, "message"),
               lambda raw: ("".join(json.loads(x)["message"]["content"] for x in raw.splitlines()),
                            json.loads(raw.splitlines()[-1])["done_reason"]),
               lambda b: (b["message"]["content"], b["done_reason"])),
}


@pytest.mark.parametrize("api", CASES)
def test_streamed_equals_not_streamed(engine, api):
    parse, renderer, read_stream, read_body = CASES[api]
    req, extra = parse(True)
    raw = _streamed(renderer(_generation(engine, req), extra))
    req, extra = parse(False)
    gen = _generation(engine, req)
    body = renderer(gen, extra).body([gen.handles[0].result(timeout=60)])
    text, finish = read_body(body)
    assert text and read_stream(raw) == (text, finish), raw[:400]
