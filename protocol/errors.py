"""Errors in the OpenAI envelope: `{"error": {"message", "type", "param", "code"}}` (Flask-free: the batch job
writes the same envelope into its output lines).

Handlers raise; the service's `app.py` maps every exception to a response in one place
(ortllm.service.errors.to_api_error, which adds werkzeug's HTTPException to `to_api_error` here):

    APIError (raised by the service itself)            -> its own status
    RequestError: EmptyPrompt, PromptTooLong, ...      -> 400 invalid_request_error, param: its field
                                                          (UnknownAdapter -> 404 model_not_found)
    Overloaded                                         -> 429 + Retry-After
    EngineDeadError                                    -> 503
    any other OrtllmError (ArtifactError, StoreError,  -> 500 server_error with its message (a broken install
      OpsLibraryError, MemoryBudgetExceeded, ...)          or model on the server side, not a bug; it says what to do)
    werkzeug HTTPException (404 route, 405, 413, ...)  -> its status
    anything else                                      -> 500, logged with the request id (a bug)
"""
from __future__ import annotations

import re

from ortllm.runtime.errors import EngineDeadError, OrtllmError, Overloaded, PromptTooLong, RequestError, UnknownAdapter


def _snake(name: str) -> str:
    """InvalidTokenIds -> invalid_token_ids"""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class APIError(OrtllmError):
    """An HTTP error with its OpenAI envelope; raised by the service and the batch job themselves."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ClientGone(APIError):
    """The client hung up while its request ran; the generation was cancelled and nobody reads this."""

    def __init__(self):
        super().__init__(499, "client closed the request", code="client_closed_request")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str, base: str, adapters: list[str] = ()) -> APIError:
    served = ", ".join(repr(m) for m in [base, *adapters])
    return APIError(404, f"the model {name!r} does not exist; this server serves {served} (GET /v1/models)",
                    param="model", code="model_not_found")


def unavailable(message: str, code: str, retry_after: int = 1) -> APIError:
    return APIError(503, message, type="service_unavailable", code=code, headers={"Retry-After": str(retry_after)})


def to_api_error(e: BaseException) -> APIError | None:
    """The APIError for e; None for an unexpected exception (a bug: the caller answers 500 and logs it)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, UnknownAdapter):      # a missing resource: 404, as an unknown `model`
        return APIError(404, str(e), param="adapters" if e.param == "adapters" else "model", code="model_not_found")
    if isinstance(e, RequestError):        # the engine's input processor's verdict, its field as `param`
        code = "context_length_exceeded" if isinstance(e, PromptTooLong) else _snake(type(e).__name__)
        return APIError(400, str(e), param=e.param, code=code)
    if isinstance(e, Overloaded):
        return APIError(429, str(e), type="rate_limit_error", code="overloaded", headers={"Retry-After": "1"})
    if isinstance(e, EngineDeadError):
        return unavailable(str(e), "engine_dead", retry_after=30)
    if isinstance(e, OrtllmError):
        return APIError(500, str(e), type="server_error", code=_snake(type(e).__name__))
    return None
