"""GET /: a one-file playground (plain HTML + JS, no build step, service/static/playground.html): prompt or chat,
sampling settings, the streamed answer with live tokens/s. It talks to the same /v1 endpoints as any client."""
from __future__ import annotations

from importlib.resources import files

from flask import Blueprint, Response

from .openapi import document

bp = Blueprint("playground", __name__)
PAGE = (files(__package__) / "static" / "playground.html").read_text(encoding="utf-8")


@bp.get("/")
@document("The playground page", ok={"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}})
def page():
    return Response(PAGE, mimetype="text/html")

