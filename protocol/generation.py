"""One generation request as the OpenAI API defines it, apart from HTTP: the checks before submit and the
non-streaming response body. The HTTP handlers (api.py) and `ortllm batch` both use these, so a batch line
and an HTTP request with the same body get the same answer."""
from __future__ import annotations

from typing import Callable

from ortllm.runtime.engine import CompletionOutput, Engine
from ortllm.runtime.errors import PromptTooLong
from ortllm.runtime.tokenizer import TokenizerFilesError

from . import openai as protocol
from .errors import APIError, bad_request, model_not_found


def resolve_adapter(engine: Engine, base_name: str, model: str | None) -> str | None:
    """`model` -> None for the base model, or the adapter it names; 404 for anything else."""
    if model is None or model == base_name:
        return None
    if model in engine.adapters.names():
        return model
    raise model_not_found(model, base_name, engine.adapters.names())


def prompt_ids(engine: Engine, req: protocol.GenerationRequest) -> list[int]:
    if req.messages is not None:
        try:
            text = engine.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True)
        except TokenizerFilesError as e:
            raise bad_request(f"{e}; use /v1/completions", param="messages") from None
        except Exception as e:  # noqa: BLE001 - the template itself rejected the conversation (raise_exception)
            raise bad_request(f"the chat template rejected these messages: {e}", param="messages") from None
        return engine.tokenizer.encode(text)
    return engine.encode_prompt(req.prompt)


def prepare(engine: Engine, req: protocol.GenerationRequest, base_name: str, max_prompt_chars: int) -> list[int]:
    """Everything checked before submit: the model, the prompt's size, max_tokens against the context.
    Sets req.params.adapter (and max_tokens when it was not given); returns the prompt's token ids."""
    req.params.adapter = resolve_adapter(engine, base_name, req.model)
    ctx = engine.context_length
    chars = len(req.prompt) if isinstance(req.prompt, str) else sum(len(m["content"]) for m in req.messages or ())
    if chars > max_prompt_chars:
        raise APIError(400, f"the prompt has {chars} characters, more than {ctx} tokens (the model's context) can "
                       "hold; shorten it", param="messages" if req.messages else "prompt",
                       code="context_length_exceeded")
    ids = prompt_ids(engine, req)
    if len(ids) >= ctx:
        raise PromptTooLong(len(ids), ctx - 1, what="the model's context length")
    if not req.max_tokens_given:     # chat without max_tokens: as much as the context and the KV pool hold
        cfg = engine.config
        room = min(ctx, engine.stats()["kv_blocks_total"] * cfg.cache.block_size,
                   cfg.scheduler.max_model_len or ctx)
        req.params.max_tokens = max(1, room - len(ids))
    elif len(ids) + req.params.max_tokens > ctx:
        raise APIError(400, f"prompt has {len(ids)} tokens and max_tokens is {req.params.max_tokens}, but the "
                       f"model's context holds {ctx}; lower max_tokens to at most {ctx - len(ids)} or shorten "
                       "the prompt", param="max_tokens", code="context_length_exceeded")
    return ids


def token_text_of(engine: Engine) -> Callable[[int], str]:
    return lambda tid: engine.tokenizer.decode([tid], skip_special_tokens=False)


def logprobs_of(kind: str, entries, logprobs: int | None, token_text: Callable[[int], str]):
    if logprobs is None:
        return None
    return (protocol.chat_logprobs(entries, token_text) if kind == "chat"
            else protocol.completion_logprobs(entries, token_text))


def response_id(kind: str, request_id: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + request_id


def response_body(kind: str, out: CompletionOutput, *, request_id: str, model: str, created: int,
                  logprobs: int | None, token_text: Callable[[int], str]) -> dict:
    """The non-streaming body of /v1/chat/completions (kind "chat") or /v1/completions."""
    lp = logprobs_of(kind, out.logprobs or [], logprobs, token_text)
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": lp,
                  "finish_reason": out.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": out.text, "logprobs": lp, "finish_reason": out.finish_reason}
        obj = "text_completion"
    return {"id": response_id(kind, request_id), "object": obj, "created": created, "model": model,
            "system_fingerprint": None, "choices": [choice],
            "usage": protocol.usage(out.prompt_tokens, len(out.token_ids))}


def max_prompt_chars(engine: Engine) -> int:
    """More characters than any prompt that fits the context can have: context x the longest vocabulary entry
    (x 2 for safety). A raw BPE entry is at least as long as the text it decodes to (byte-level: a char per
    byte; sentencepiece: "\u2581" per space; byte fallback "<0xE2>" longer still), so a prompt past this is
    refused without tokenizing it: a 1 MB prompt costs seconds of tokenizer CPU otherwise."""
    tok = engine.tokenizer
    longest = max((len(tok.id_to_token(i) or "") for i in range(tok.vocab_size)), default=1)
    return 2 * engine.context_length * max(longest, 1) + 1024
