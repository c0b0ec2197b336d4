"""Bearer-key check shared by the API blueprints (`--api-key`); no key configured: open."""
from __future__ import annotations

import hmac

from flask import current_app, request

from .errors import APIError


def require_api_key() -> None:
    key = current_app.config["ORTLLM"].api_key
    if key is None:
        return
    got = request.headers.get("Authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "invalid or missing API key; send `Authorization: Bearer KEY`",
                       type="authentication_error", code="invalid_api_key")
