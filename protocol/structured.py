"""Structured output and tool calls as the OpenAI API (and vLLM's extension fields) define them, apart from HTTP.

    response_format {type: json_object | json_schema}  -> Guide (runtime/guided.py: llguidance token masks)
    guided_json / guided_regex / guided_choice / guided_grammar (Lark)
                                                         -> Guide (completions and chat, vLLM's names)
    tools + tool_choice                                  -> ToolSpec: the prompt describes the tools; "required"
                                                            and a named function force a call through a Guide
    the generated text                                   -> message.tool_calls (tool_calls.ToolCallParser,
                                                            streamed as OpenAI streams them)

A call is generated as one JSON object {"name": ..., "arguments": {...}} (the shape SmolLM2 and Hermes-style
templates use inside <tool_call> tags); with tool_choice "auto" the model may also answer in text, and a reply
that is such an object, bare or inside <tool_call></tool_call>, becomes tool_calls. Every problem is a 400
naming the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ortllm.runtime.sampling_params import Guide

from .errors import bad_request
from .tool_calls import CLOSE as TOOL_CALL_CLOSE
from .tool_calls import OPEN as TOOL_CALL_OPEN
from .tool_calls import ToolCallParser


def check_schema(schema, param: str) -> dict:
    """A JSON schema object that passes the JSON Schema meta-schema, or a 400 naming param."""
    from jsonschema import exceptions, validators

    if not isinstance(schema, dict):
        raise bad_request(f"{param} must be a JSON schema object; got {json.dumps(schema)[:60]}", param=param,
                          code="invalid_json_schema")
    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(schema)
    except exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise bad_request(f"{param} is not a valid JSON schema at {where}: {e.message}", param=param,
                          code="invalid_json_schema") from None
    return schema


def response_format_guide(rf: dict | None) -> Guide | None:
    """OpenAI's response_format (its shape checked by bodies.RESPONSE_FORMAT): {type: text} | {type: json_object}
    | {type: json_schema, json_schema: {name, schema, strict}}."""
    if rf is None or rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return Guide("json_object", None, "response_format")
    schema = check_schema(rf["json_schema"]["schema"], "response_format.json_schema.schema")
    return Guide("json_schema", schema, "response_format")


def guided_fields(v: dict) -> Guide | None:
    """vLLM's extension fields (read() values): guided_json (schema or JSON text), guided_regex, guided_choice,
    guided_grammar; at most one (the bodies' rules)."""
    given = [k for k in ("guided_json", "guided_regex", "guided_choice", "guided_grammar") if v.get(k) is not None]
    if not given:
        return None
    k, spec = given[0], v[given[0]]
    if k == "guided_json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError as e:
                raise bad_request(f"guided_json is not valid JSON: {e}", param=k, code="invalid_json") from None
        return Guide("json_schema", check_schema(spec, k), k)
    if k == "guided_regex":
        return Guide("regex", spec, k)
    if k == "guided_grammar":
        return Guide("lark", spec, k)
    return Guide("choice", list(spec), k)


# ---------------------------------------------------------------- tools

@dataclass
class ToolSpec:
    tools: list[dict]          # OpenAI tool definitions, as sent (parameters defaulted to an empty object)
    choice: str                # "auto" | "required" | a function name (forced)

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def guide(self) -> Guide | None:
        """A forced call (required / named): one JSON object naming a tool, with arguments per its schema."""
        if self.choice == "auto":
            return None
        chosen = [t for t in self.tools if self.choice == "required" or t["function"]["name"] == self.choice]
        # arguments without an explicit additionalProperties get only the declared ones (OpenAI's strict mode):
        # a small model otherwise keeps inventing keys until max_tokens
        options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                    "properties": {"name": {"const": t["function"]["name"]},
                                   "arguments": {"additionalProperties": False, **t["function"]["parameters"]}}}
                   for t in chosen]
        return Guide("json_schema", options[0] if len(options) == 1 else {"anyOf": options}, "tools")

    def reader(self, call_id: str) -> ToolCallParser:
        """A parser for one reply (call ids call_{call_id}_{k})."""
        return ToolCallParser(self.names, call_id)

    def system_prompt(self) -> str:
        """The tools described for templates that do not render them (SmolLM2-135M's does not)."""
        listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in self.tools)
        return ("You can call functions. They are described in JSON Schema within <tools></tools>:\n"
                f"<tools>\n{listing}\n</tools>\n"
                "To call one, answer only with a JSON object "
                '{"name": <function name>, "arguments": <arguments object>} within <tool_call></tool_call> tags. '
                "A function's result comes back in a message from the tool.")


def parse_tools(tools: list | None, choice) -> ToolSpec | None:
    """tools and tool_choice (their shapes checked by bodies.TOOLS / TOOL_CHOICE) -> ToolSpec; None: no tools."""
    if not tools:             # a forced call needs tools (CHAT's rules)
        return None
    clean, seen = [], set()
    for i, t in enumerate(tools):
        fn = t["function"]
        name = fn["name"]
        if name in seen:
            raise bad_request(f"tools[{i}].function.name {name!r} is defined twice", param="tools",
                              code="duplicate_tool_name")
        seen.add(name)
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        check_schema(params, f"tools[{i}].function.parameters")
        desc = fn.get("description")
        clean.append({"type": "function", "function": {"name": name, **({"description": desc} if desc else {}),
                                                       "parameters": params}})
    if choice == "none":
        return None
    mode = choice["function"]["name"] if isinstance(choice, dict) else choice or "auto"
    if mode not in ("auto", "required") and mode not in seen:
        raise bad_request(f"tool_choice names the function {mode!r}, which is not in tools "
                          f"({', '.join(sorted(seen))})", param="tool_choice", code="unknown_tool")
    return ToolSpec(clean, mode)


def render_messages(messages: list[dict], tools: ToolSpec | None, template_takes_tools: bool) -> list[dict]:
    """Messages for the chat template: assistant tool calls and tool results as text the model was trained on
    (SmolLM2 / Hermes style), and the tool list as a system message unless the template renders it."""
    out = []
    for m in messages:
        content = m.get("content") or ""
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(f"{TOOL_CALL_OPEN}\n{json.dumps(c, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"
                              for c in m["tool_calls"])
            content = (content + "\n" if content else "") + calls
        out.append({"role": m["role"], "content": content})
    if tools is not None and not template_takes_tools:
        sys = tools.system_prompt()
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + sys}
        else:
            out.insert(0, {"role": "system", "content": sys})
    return out
