"""The API-key check shared by the API blueprints (`--api-key`): `Authorization: Bearer KEY`, or `x-api-key: KEY`
(the header Anthropic's clients send); no key configured: open."""
from __future__ import annotations

import hmac

from flask import current_app, request

from .errors import APIError


def require_api_key() -> None:
    key = current_app.config["ORTLLM"].api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    got = request.headers.get("x-api-key") or (token.strip() if scheme.lower() == "bearer" else "")
    if not hmac.compare_digest(got.encode(), key.encode()):
        raise APIError(401, "invalid or missing API key; send `Authorization: Bearer KEY` (or `x-api-key: KEY`)",
                       type="authentication_error", code="invalid_api_key")
