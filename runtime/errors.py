"""Errors in layers (docs/architecture.md, Conventions): every error a user can see is an OrtllmError, so the
CLI prints any of them as one line (`ortllm: error: ...`, cli/__init__.py main) and the service answers any of
them with its error envelope (protocol/errors.py to_api_error). tests/test_errors.py checks that no product
module defines an exception outside this tree.

    OrtllmError
    ├── ConfigError(ValueError)        bad configuration; raised at construction, before anything runs
    ├── RequestError(ValueError)       one request is wrong; it fails, the engine goes on (HTTP 400)
    │   ├── PromptTooLong              the prompt leaves no room for a token (see fit_max_tokens)
    │   │   └── PromptTooManyChars     refused before tokenizing: more characters than the context can hold
    │   ├── InvalidSamplingParams
    │   ├── UnknownAdapter
    │   ├── InvalidTokenIds
    │   ├── EmptyPrompt
    │   ├── InvalidGrammar             a response format / schema / regex the grammar compiler refused
    │   └── AdapterLoadError           runtime/adapters.py
    ├── Overloaded                     queue full; raised at submit at once, retry later (HTTP 429/503)
    ├── EngineDeadError                fatal; the engine stopped and every pending request fails with it
    ├── ArtifactError                  runtime/artifact.py: missing, damaged or of another version
    ├── AdapterFileError               runtime/adapter_files.py: a PEFT directory or adapter name is wrong
    ├── OpsLibraryError                runtime/ops_library.py: libortllm_ops.so missing or stale (make ops)
    ├── StoreError                     runtime/store.py: the local model store
    ├── ArtifactUnavailable            service/ray_artifacts.py: a Ray node cannot get the deployed model
    ├── MemoryBudgetExceeded           runtime/session_manager.py
    ├── TokenizerFilesError(ValueError)  runtime/tokenizer.py
    ├── APIError                       protocol/errors.py: an HTTP error with its OpenAI envelope
    │   └── ClientGone
    ├── BuildError                     pipeline/errors.py: a build input or option is wrong
    ├── TokenizerError(ValueError)     pipeline/tokenizer.py
    ├── DataError, EvalError           calibration/data.py, calibration/eval.py
    ├── BatchFileError                 batch/output.py
    └── BenchError                     bench/errors.py: a scenario could not run
        └── StreamError                bench/client.py: the server answered with an error

Messages say what to do, not only what went wrong.
"""

from __future__ import annotations


class OrtllmError(Exception):
    """Base of every error ortllm raises on purpose."""


class ConfigError(OrtllmError, ValueError):
    """A configuration value is invalid; the message names the field and what to change."""


class RequestError(OrtllmError, ValueError):
    """A single request is invalid. Only that request fails. `param`: the request field at fault (a SamplingParams
    field, or prompt / adapter / adapters), None when no one field is (every API's envelope names it)."""

    def __init__(self, message: str = "", param: str | None = None):
        self.param = param
        super().__init__(message)


class PromptTooLong(RequestError):
    def __init__(self, prompt_len: int, max_len: int, max_tokens: int = 0, what: str = ""):
        self.prompt_len = prompt_len
        self.max_len = max_len
        self.max_tokens = max_tokens
        need = prompt_len + max_tokens
        where = f" ({what})" if what else ""
        if max_tokens:
            msg = (f"prompt has {prompt_len} tokens and max_tokens is {max_tokens}: {need} tokens, but at most "
                   f"{max_len} fit{where}; shorten the prompt or lower max_tokens")
        else:
            msg = f"prompt has {prompt_len} tokens but at most {max_len} fit{where}; shorten the prompt"
        super().__init__(msg)


class PromptTooManyChars(PromptTooLong):
    """A prompt refused before it is tokenized: more characters than any prompt that fits can have."""

    def __init__(self, chars: int, max_chars: int, context_length: int, param: str = "prompt"):
        RequestError.__init__(self, f"the prompt has {chars} characters, more than {context_length} tokens (the "
                              f"model's context) can hold; shorten it", param)
        self.prompt_len, self.max_len, self.max_tokens = chars, max_chars, 0


class AdapterFileError(OrtllmError):
    """A PEFT LoRA directory cannot become an artifact adapter, or an adapter name is wrong or taken; the message
    says what to change (runtime/adapter_files.py)."""


class InvalidSamplingParams(RequestError):
    """A sampling parameter is out of range; the message names the field and the allowed range, `param` the field."""


class UnknownAdapter(RequestError):
    """param "adapter" (one adapter) or "adapters" (a mix names it)."""

    def __init__(self, name: str, known: list[str] | None = None, param: str = "adapter"):
        self.name = name
        hint = f"; known adapters: {', '.join(sorted(known))}" if known else "; list them with `ortllm adapters list`"
        if param == "adapters":
            msg = f"adapters names {name!r}, which is not an adapter of this model{hint}"
        else:
            msg = f"unknown adapter {name!r}{hint}"
        super().__init__(msg, param)


class InvalidTokenIds(RequestError):
    """Token ids outside [0, vocab_size)."""


class EmptyPrompt(RequestError):
    def __init__(self, msg: str = "prompt is empty; send at least one token", param: str = "prompt"):
        super().__init__(msg, param)


class InvalidGrammar(RequestError):
    """A structured-output constraint (JSON schema, regex, choice list) cannot be compiled; `param` names the
    request field it came from."""



class Overloaded(OrtllmError):
    """The request queue is full. Nothing was queued; retry after a short wait."""

    def __init__(self, queued: int, max_queued: int):
        self.queued = queued
        self.max_queued = max_queued
        super().__init__(f"server overloaded: {queued} requests queued (max_queued={max_queued}); "
                         "retry later or raise max_queued")


class EngineDeadError(OrtllmError):
    """The engine loop stopped on an unexpected error; restart the engine. `__cause__` holds the original."""
