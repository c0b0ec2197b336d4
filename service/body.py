"""The JSON object of a Flask request, or a 4xx saying what is wrong with it."""
from __future__ import annotations

from flask import Request

from ortllm.protocol.errors import APIError
from ortllm.protocol.openai import parse_json_object

# Ollama reads any body as JSON, whatever its Content-Type: its documentation sends `curl URL -d '{...}'`
# (curl's default application/x-www-form-urlencoded), and so do scripts written from it
ANY_CONTENT_TYPE = ("/api/",)


def read_json_object(request: Request) -> dict:
    mimetype = request.mimetype or ""
    if mimetype != "application/json" and not request.path.startswith(ANY_CONTENT_TYPE):
        raise APIError(415, f"send the body as JSON with Content-Type: application/json; got {mimetype or 'none'!r}",
                       code="unsupported_media_type")
    return parse_json_object(request.get_data(cache=False))
