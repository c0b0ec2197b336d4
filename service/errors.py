"""The service's error mapping: the protocol's (ortllm.protocol.errors) plus werkzeug's HTTPException.

    werkzeug HTTPException (404 route, 405, 413, ...)  -> its status
    anything else                                      -> 500, logged with the request id (a bug)
"""
from __future__ import annotations

from werkzeug.exceptions import HTTPException

from ortllm.protocol import errors as protocol_errors
from ortllm.protocol.errors import APIError, ClientGone, bad_request, model_not_found, unavailable

__all__ = ["APIError", "ClientGone", "bad_request", "model_not_found", "unavailable", "to_api_error"]

_HTTP_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error"}


def to_api_error(e: BaseException) -> APIError | None:
    """The APIError for e; None for an unexpected exception (a bug: the caller answers 500 and logs it)."""
    if isinstance(e, HTTPException):
        status = e.code or 500
        if status >= 500:
            return None
        msg = e.description or e.name
        if status == 413:
            msg = "request body too large; " + msg
        # RFC 9110: a 405 says what the route takes (Allow); werkzeug keeps it in valid_methods
        allow = {"Allow": ", ".join(sorted(e.valid_methods))} if getattr(e, "valid_methods", None) else {}
        return APIError(status, msg, type=_HTTP_TYPES.get(status, "invalid_request_error"),
                        code=e.name.lower().replace(" ", "_"), headers=allow)
    return protocol_errors.to_api_error(e)
