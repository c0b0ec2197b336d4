"""One generation request as the OpenAI API defines it, apart from HTTP: what it submits (prepare: the adapter
`model` names, each prompt's token ids; the engine's input processor checks the rest), the non-streaming response
body and the streamed chunks (OpenAIRenderer). The HTTP service and `ortllm batch` both use
these, so a batch line and an HTTP request with the same body get the same answer."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ortllm.runtime.engine import CompletionOutput, Engine
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.runtime.tokenizer import TokenizerFilesError

from . import openai as protocol
from . import structured
from .errors import APIError, bad_request, model_not_found
from .harmony import HarmonyReply
from .rendering import Generation, Renderer, chat_deltas, chat_reader, sse


def resolve_adapter(engine: Engine, base_name: str, model: str | None) -> str | None:
    """`model` -> None for the base model, or the adapter it names; 404 for anything else."""
    if model is None or model == base_name:
        return None
    if model in engine.adapters.names():
        return model
    raise model_not_found(model, base_name, engine.adapters.names())


@dataclass(frozen=True)
class Submission:
    """What a generation request submits, made without changing the parsed request: per prompt (completions may
    send a list), its token ids; and the request's parameters with the adapter `model` names."""
    params: SamplingParams
    prompts: list[list[int]]


def prompt_ids(engine: Engine, req: protocol.GenerationRequest, prompt: str | list[int] | None = None) -> list[int]:
    """The token ids of the chat's rendered conversation, or of `prompt` (a completion's; default: req.prompt),
    checked by the engine's input processor (characters, token ids) and naming the field they came from."""
    if req.messages is not None:
        tok = engine.tokenizer
        takes_tools = tok.template_takes_tools
        messages = structured.render_messages(req.messages, req.tools, takes_tools)
        tools = req.tools.tools if req.tools is not None and takes_tools else None
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tools=tools,
                                           reasoning_effort=req.reasoning_effort) + req.prefill
        except TokenizerFilesError as e:
            raise bad_request(f"{e}; use /v1/completions", param="messages") from None
        except Exception as e:  # noqa: BLE001 - the template itself rejected the conversation (raise_exception)
            raise bad_request(f"the chat template rejected these messages: {e}", param="messages") from None
        return engine.encode_prompt(text, "messages", special_tokens=False)
    return engine.encode_prompt(req.prompt if prompt is None else prompt, "prompt")


def prepare(engine: Engine, req: protocol.GenerationRequest, base_name: str, model: str | None = None,
            several: bool = False) -> Submission:
    """What the wire format decides before submit: which adapter `model` names (404 if none), each prompt's token
    ids, max_tokens left to the engine when the body has none. Everything else (ranges, adapters and mixes,
    logit_bias, the context, grammars) the engine's input processor checks at submit (runtime/request_input.py),
    the same for every API. model: the name routed within the served model (default: req.model).
    several=False (one output per request, as `ortllm batch` answers): n, prompt lists, echo and tools refused."""
    if not several:
        for name, bad in (("n", req.n != 1), ("prompt", bool(req.prompts) and len(req.prompts) > 1),
                          ("echo", req.echo), ("tools", req.tools is not None)):
            if bad:
                raise bad_request(f"{name} is not supported here (one completion per line); use the HTTP API",
                                  param=name)
    adapter = resolve_adapter(engine, base_name, req.model if model is None else model)
    max_tokens = req.params.max_tokens
    if max_tokens is None and engine.limits.max_tokens is None:
        max_tokens = req.api_max_tokens     # the API's own default (completions: 16); None: the room left
    params = replace(req.params, adapter=adapter, max_tokens=max_tokens)
    return Submission(params, [prompt_ids(engine, req, p) for p in (req.prompts or [req.prompt])])


def token_text_of(engine: Engine) -> Callable[[int], str]:
    return lambda tid: engine.tokenizer.decode([tid], skip_special_tokens=False)


def logprobs_of(kind: str, entries, logprobs: int | None, token_text: Callable[[int], str]):
    if logprobs is None:
        return None
    return (protocol.chat_logprobs(entries, token_text) if kind == "chat"
            else protocol.completion_logprobs(entries, token_text))


def choice_of(kind: str, index: int, out: CompletionOutput, req: protocol.GenerationRequest, request_id: str,
              token_text: Callable[[int], str], prompt: tuple | None = None, harmony: bool = False) -> dict:
    """One entry of `choices` for a finished output (harmony's channels split, tool calls parsed, echo applied)."""
    lp = logprobs_of(kind, out.logprobs or [], req.logprobs, token_text)
    if kind == "chat":
        reader = chat_reader(req, f"{request_id}_{index}", harmony)     # the parser a stream of this reply uses
        if reader is None:
            return {"index": index, "message": {"role": "assistant", "content": out.text}, "logprobs": lp,
                    "finish_reason": out.finish_reason}
        reader.feed(out.text)
        reader.finish()
        return {"index": index, "message": reader.message(), "logprobs": lp,
                "finish_reason": reader.finish_reason(out.finish_reason)}
    text = out.text
    if req.echo:
        text = prompt[0]() + ("" if req.echo_only else out.text)
        if req.logprobs is not None:
            lp = echo_logprobs(out, prompt[1], token_text, req.echo_only)
    return {"index": index, "text": text, "logprobs": lp, "finish_reason": "length" if req.echo_only
            else out.finish_reason}


def echo_logprobs(out: CompletionOutput, prompt_ids: list[int], token_text: Callable[[int], str],
                  prompt_only: bool) -> dict:
    """Completions' logprobs over the prompt (the first token has none, as OpenAI) and then the completion."""
    entries = list(out.prompt_logprobs or [])
    lp = protocol.completion_logprobs([e for e in entries if e is not None], token_text)
    if entries and entries[0] is None:
        first = token_text(prompt_ids[0])
        lp = {"tokens": [first] + lp["tokens"], "token_logprobs": [None] + lp["token_logprobs"],
              "top_logprobs": [None] + lp["top_logprobs"],
              "text_offset": [0] + [o + len(first) for o in lp["text_offset"]]}
    if not prompt_only and out.logprobs:
        start = sum(len(t) for t in lp["tokens"])
        more = protocol.completion_logprobs(out.logprobs, token_text, start)
        lp = {k: lp[k] + more[k] for k in lp}
    return lp


def usage_of(outs: list[CompletionOutput], n: int, echo_only: bool = False) -> dict:
    """One prompt counted once per prompt (the first of its n), completions summed, cached tokens reported."""
    firsts = outs[::n]
    return protocol.usage(sum(o.prompt_tokens for o in firsts),
                          0 if echo_only else sum(len(o.token_ids) for o in outs),
                          sum(o.cached_tokens for o in firsts))


def response_body_n(kind: str, outs: list[CompletionOutput], req: protocol.GenerationRequest, *, request_id: str,
                    model: str, created: int, token_text: Callable[[int], str], prompts: list,
                    harmony: bool = False) -> dict:
    """The non-streaming body for several outputs: prompt p's j-th completion is choice p * n + j.
    prompts: per prompt, (a function giving its text, its token ids), for echo. harmony: chat replies in harmony."""
    choices = [choice_of(kind, i, o, req, request_id, token_text, prompts[i // req.n], harmony)
               for i, o in enumerate(outs)]
    return {"id": response_id(kind, request_id), "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": model, "system_fingerprint": None, "choices": choices,
            "usage": usage_of(outs, req.n, req.echo_only)}


def response_id(kind: str, request_id: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + request_id


def response_body(kind: str, out: CompletionOutput, *, request_id: str, model: str, created: int,
                  logprobs: int | None, token_text: Callable[[int], str], harmony: bool = False) -> dict:
    """The non-streaming body of /v1/chat/completions (kind "chat") or /v1/completions; harmony: a chat reply in
    harmony, split by channel."""
    lp = logprobs_of(kind, out.logprobs or [], logprobs, token_text)
    if kind == "chat":
        reply = HarmonyReply() if harmony else None
        if reply is not None:
            reply.feed(out.text)
            reply.finish()
        choice = {"index": 0, "message": reply.message() if reply else {"role": "assistant", "content": out.text},
                  "logprobs": lp, "finish_reason": out.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": out.text, "logprobs": lp, "finish_reason": out.finish_reason}
        obj = "text_completion"
    return {"id": response_id(kind, request_id), "object": obj, "created": created, "model": model,
            "system_fingerprint": None, "choices": [choice],
            "usage": protocol.usage(out.prompt_tokens, len(out.token_ids), out.cached_tokens)}


class OpenAIRenderer(Renderer):
    """/v1/chat/completions (kind "chat") and /v1/completions: `data: {chunk}` server-sent events, the last choice
    to finish carrying the usage, then `data: [DONE]`; not streamed, response_body_n's body."""

    def __init__(self, gen: Generation, kind: str):
        super().__init__(gen)
        self.kind, self.chat = kind, kind == "chat"
        self.id = response_id(kind, gen.request_id)
        n = len(gen.handles)
        # with tools or harmony, each reply goes through the parser the non-streamed answer uses
        self.readers = [chat_reader(gen.req, f"{gen.request_id}_{i}", gen.harmony and self.chat) for i in range(n)]
        self._lp_sent = [0] * n            # per choice, the logprobs entries already sent

    def opening(self) -> list[bytes]:
        if not self.chat:
            return []
        return [sse(self._chunk(i, {"role": "assistant", "content": ""})) for i in range(len(self.gen.handles))]

    def delta(self, i: int, text: str, last: bool) -> list[bytes]:
        if self.readers[i] is None:
            deltas = [{"content": text} if self.chat else text] if text else []
        else:
            deltas = chat_deltas(self.readers[i], text, last)
        # a delta's logprobs go with its first chunk (held text: with the next)
        return [sse(self._chunk(i, d, lp=self._new_logprobs(i))) for d in deltas]

    def finished(self, i: int, out: CompletionOutput, outs: list) -> list[bytes]:
        reader = self.readers[i]
        reason = out.finish_reason if reader is None else reader.finish_reason(out.finish_reason)
        final = self._chunk(i, None if self.chat else "", finish=reason, lp=self._new_logprobs(i))   # any left
        if all(o is not None for o in outs):               # the last choice to finish carries the usage
            final["usage"] = usage_of(outs, self.gen.req.n)
        return [sse(final)]

    def closing(self, outs: list[CompletionOutput]) -> list[bytes]:
        if not self.gen.req.include_usage:
            return []
        return [sse({"id": self.id, "object": self._object, "created": self.gen.created, "model": self.gen.model,
                     "choices": [], "usage": usage_of(outs, self.gen.req.n)})]

    def stream_error(self, err: APIError) -> bytes:
        return sse(err.body())

    def trailer(self) -> list[bytes]:
        return [b"data: [DONE]\n\n"]

    def body(self, outs: list[CompletionOutput]) -> dict:
        g = self.gen
        prompts = [(lambda p=p: g.prompt_text(p), ids) for p, ids in enumerate(g.prompts)]
        return response_body_n(self.kind, outs, g.req, request_id=g.request_id, model=g.model, created=g.created,
                               token_text=g.token_text, prompts=prompts, harmony=g.harmony)

    @property
    def _object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _new_logprobs(self, i: int):
        h = self.gen.handles[i]
        if self.gen.req.logprobs is None or h.logprobs is None:
            return None
        n = len(h.logprobs)
        entries, self._lp_sent[i] = h.logprobs[self._lp_sent[i]:n], n
        return logprobs_of(self.kind, entries, self.gen.req.logprobs, self.gen.token_text) if entries else None

    def _chunk(self, i: int, delta: dict | str | None, finish: str | None = None, lp=None) -> dict:
        if self.chat:
            choice = {"index": i, "delta": delta or {}, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": i, "text": delta or "", "logprobs": lp, "finish_reason": finish}
        return {"id": self.id, "object": self._object, "created": self.gen.created, "model": self.gen.model,
                "system_fingerprint": None, "choices": [choice]}
