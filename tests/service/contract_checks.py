"""schemathesis checks for the API document as the contract (a hooks module: SCHEMATHESIS_HOOKS=
tests.service.contract_checks, and imported by the tests).

`positive_data_acceptance_documented` is schemathesis' positive_data_acceptance (a request the document allows is
not refused) except for the refusals no JSON Schema can state, each a 400 with its own code (OpenAI's envelope) or
message (Anthropic's, which has no code), listed in the document's 400 description:

    context_length_exceeded   the prompt's tokens do not fit the context (a count of tokens, not of characters)
    invalid_json_schema       a JSON Schema (response_format, tools' parameters, guided_json) that is not one
    invalid_grammar           a valid one (or a regular expression) the grammar engine (llguidance) cannot compile
    invalid_json              text that must be JSON (guided_json as text, a Responses function_call's arguments)
    duplicate_tool_name       two tools of one name
    unknown_tool              tool_choice names a function that tools does not define
    digest_mismatch           a blob whose sha256 is not the digest its path names
"""
from __future__ import annotations

import json
import re

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

UNSCHEMATIZABLE = {"context_length_exceeded", "invalid_json_schema", "invalid_grammar", "invalid_json",
                   "duplicate_tool_name", "unknown_tool", "digest_mismatch"}
# the same refusals in Anthropic's envelope (no code): their messages
_MESSAGES = re.compile(r"at most \d+ fit \(|is not a valid JSON schema|must be a JSON schema object|cannot be compiled|"
                       r"is defined twice|which is not in tools|is not valid JSON|must be JSON text")


def unschematizable(response) -> bool:
    """A 400 for a constraint no schema can state (above)."""
    if response.status_code != 400:
        return False
    try:
        err = json.loads(response.content).get("error") or {}
    except ValueError:
        return False
    return err.get("code") in UNSCHEMATIZABLE or bool(_MESSAGES.search(err.get("message") or ""))


@schemathesis.check
def positive_data_acceptance_documented(ctx, response, case):
    if unschematizable(response):
        return None
    return positive_data_acceptance(ctx, response, case)
