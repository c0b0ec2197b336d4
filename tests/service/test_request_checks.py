"""The same invalid request through every API gets the engine's input processor's decision (runtime/request_input.py)
and a message naming the same field: the HTTP answer's message is the one Engine.submit raises for it, so a field
checked anywhere else (with its own message) fails this table."""
import pytest

from ortllm.batch.protocol import LineItem
from ortllm.batch.runner import run_all
from ortllm.runtime.errors import RequestError
from ortllm.runtime.sampling_params import SamplingParams

MSG = [{"role": "user", "content": "hi"}]
CASES = {   # field -> (the engine's params, {API: (route, body)}), every body the same mistake in its own wire format
    "adapters": (SamplingParams(adapters={"nope": 0.5}), {
        "chat": ("/v1/chat/completions", {"messages": MSG, "adapters": {"nope": 0.5}}),
        "completions": ("/v1/completions", {"prompt": "hi", "adapters": {"nope": 0.5}}),
        "ollama_chat": ("/api/chat", {"messages": MSG, "adapters": {"nope": 0.5}, "stream": False}),
        "ollama_generate": ("/api/generate", {"prompt": "hi", "adapters": {"nope": 0.5}, "stream": False}),
        "messages": ("/v1/messages", {"messages": MSG, "max_tokens": 4, "adapters": {"nope": 0.5}}),
    }),
    "logit_bias": (SamplingParams(logit_bias={10**6: 1.0}), {
        "chat": ("/v1/chat/completions", {"messages": MSG, "logit_bias": {"1000000": 1}}),
        "completions": ("/v1/completions", {"prompt": "hi", "logit_bias": {"1000000": 1}}),
    }),
}
ROWS = [(field, api) for field, (_, apis) in CASES.items() for api in apis]


def engine_message(engine, params) -> str:
    with pytest.raises(RequestError) as e:
        engine.submit("hi", params)
    return str(e.value)


def error_of(body: dict) -> tuple[str, str | None]:
    """(message, param) of an error answer in the API's envelope (a bare message, or an object; Anthropic's has no
    param)."""
    err = body["error"]
    return (err, None) if isinstance(err, str) else (err["message"], err.get("param"))


@pytest.mark.parametrize("field,api", ROWS, ids=[f"{f}-{a}" for f, a in ROWS])
def test_same_decision_through_every_api(tiny_live, field, api):
    params, apis = CASES[field]
    route, body = apis[api]
    r = tiny_live.post(route, json={"model": tiny_live.model, **body})
    assert r.status_code in (400, 404), r.text
    message, param = error_of(r.json())
    assert message == engine_message(tiny_live.engine, params) and field in message, message
    assert param in (None, field), r.json()


@pytest.mark.parametrize("field", list(CASES))
def test_same_decision_in_a_batch(tiny_live, field):
    params, apis = CASES[field]
    _, body = apis["chat"]
    line = run_all(tiny_live.engine, tiny_live.model, [LineItem(1, "a", "chat", {"model": tiny_live.model, **body})])[0]
    err = line["response"]["body"]["error"]
    assert err["param"] == field and err["message"] == engine_message(tiny_live.engine, params), line
