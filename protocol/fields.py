"""Request bodies declared once: each field's JSON Schema is what the parser validates the field with and what
/openapi.json publishes (service/openapi.py), so the two cannot drift.

    Field   name, schema of a present value (JSON Schema 2020-12, the dialect of OpenAPI 3.1), default,
            required, description; null counts as absent for an optional field (OpenAI clients send nulls)
    Body    the fields of one request body: read(body) validates each present field against its schema and
            returns {name: value or default}; schema() is the body's JSON Schema for the API document
    Rule    a constraint between fields (a forbidden combination), checked by read() and published as `not`
    BOUND   a served model's limit (largest token id, embedding width), published where the document knows it

An "integer" is JSON Schema's (21493.0 is one) and read() hands it on as an int.

A field that fails its schema is a 400 naming it (`param`): the field, dotted into nested objects
(`response_format.json_schema.schema`, `options.temperature`); inside a list it stays the list's name
(`messages`) and the message says where (`messages[0].role must be one of ...`). What a schema cannot say
(one field's meaning depending on another, a JSON schema being a valid one) the parsers check after read(),
with the same 400. Fields the body does not declare are ignored, as OpenAI's API does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from .errors import bad_request

# "integer" is JSON Schema's: any number without a fractional part, 21493.0 included (the reference APIs publish
# `type: integer`, and a JSON encoder may write 21493.0 for it); read() hands such a value on as an int, so token
# ids, counts and seeds stay ints below the protocol.
_Validator = Draft202012Validator
_TYPES = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
          "object": "an object", "array": "a list", "null": "null"}


@dataclass
class Field:
    name: str
    schema: dict                          # of a present, non-null value
    default: Any = None
    required: bool = False
    description: str = ""
    hint: str = ""                        # what the value must be, for messages where the schema is a union
    _validator: Any = field(default=None, repr=False, compare=False)

    def check(self, value):
        """value, its integers as ints (as_declared); a 400 naming the field if it does not match its schema."""
        if self._validator is None:
            self._validator = _Validator(self.schema)
        err = next(iter(self._validator.iter_errors(value)), None)
        if err is not None:
            raise bad_request(_message(self, err), param=_param(self.name, err))
        return as_declared(self.schema, value)

    def published(self, extra: dict | None = None, bounds: dict[str, int] | None = None) -> dict:
        """The field's schema in the API document: with its description, default and (optional fields) null;
        bounds: the served model's limits (BOUND keys) where known, else those keys are left out. A field whose
        schema is false (accepted only as null: a parameter not supported here) is published as null."""
        if self.schema is False:
            return {"type": "null", **({"description": self.description} if self.description else {})}
        s = {**with_bounds(self.schema, bounds or {}), **(extra or {})}
        if self.description:
            s["description"] = self.description
        if self.default is not None:
            s["default"] = self.default
        return s if self.required else _or_null(s)


# A model's limit in a schema: {"type": "integer", BOUND: "token_id"} is published as "maximum": the served
# model's largest token id, where the document knows it (service/openapi.py); validation ignores the key (the
# engine checks the value against the model it reaches).
# {"type": "string", DECIMAL_BOUND: "token_id"} likewise: a pattern of the decimals from 0 to that maximum.
BOUND = "x-ortllm-maximum"
DECIMAL_BOUND = "x-ortllm-decimal-maximum"


def with_bounds(schema, bounds: dict[str, int]):
    """schema with each BOUND / DECIMAL_BOUND key replaced by the maximum it names (left out where bounds has
    none)."""
    if isinstance(schema, list):
        return [with_bounds(s, bounds) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: with_bounds(v, bounds) for k, v in schema.items() if k not in (BOUND, DECIMAL_BOUND)}
    if schema.get(BOUND) in bounds:
        out["maximum"] = bounds[schema[BOUND]]
    if schema.get(DECIMAL_BOUND) in bounds:
        out["pattern"] = f"^0*({decimals_up_to(bounds[schema[DECIMAL_BOUND]])})$"
    return out


def decimals_up_to(m: int) -> str:
    """A regular expression of the decimal numbers 0..m (no leading zeros): 258 -> [0-9]|[1-9][0-9]|1[0-9]{2}|..."""
    top = str(m)
    k = len(top)
    alts = ["[0-9]"] if k > 1 else []
    alts += [f"[1-9][0-9]{{{j - 1}}}" for j in range(2, k)]
    for i, d in enumerate(top):                  # top's first i digits, a smaller digit here, any digits after
        lo = 1 if i == 0 and k > 1 else 0
        if int(d) > lo:
            rest = f"[0-9]{{{k - i - 1}}}" if k - i - 1 else ""
            alts.append(f"{top[:i]}[{lo}-{int(d) - 1}]{rest}")
    alts.append(top)
    return "|".join(alts)


def _says_integer(schema: dict) -> bool:
    t = schema.get("type")
    return t == "integer" or (isinstance(t, list) and "integer" in t)


def as_declared(schema, v):
    """v (valid against schema) with each integral float where the schema says integer made an int, into lists,
    objects and the alternative of anyOf / oneOf that v matches."""
    if not isinstance(schema, dict):
        return v
    if isinstance(v, float) and not isinstance(v, bool):
        return int(v) if _says_integer(schema) and v.is_integer() else v
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branch = next((b for b in schema[key] if _Validator(b).is_valid(v)), None)
            if branch is not None:
                v = as_declared(branch, v)
    if isinstance(v, list) and isinstance(schema.get("items"), dict):
        return [as_declared(schema["items"], x) for x in v]
    if isinstance(v, dict) and ("properties" in schema or isinstance(schema.get("additionalProperties"), dict)):
        props, rest = schema.get("properties", {}), schema.get("additionalProperties")
        return {k: as_declared(props.get(k, rest if isinstance(rest, dict) else {}), x) for k, x in v.items()}
    return v


def integer(name: str, default=None, lo: int | None = None, hi: int | None = None, description: str = "",
            required: bool = False) -> Field:
    return Field(name, _bounded({"type": "integer"}, lo, hi), default, required, description)


def number(name: str, default=None, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           description: str = "") -> Field:
    s = _bounded({"type": "number"}, None if lo_open else lo, hi)
    if lo_open:
        s["exclusiveMinimum"] = lo
    return Field(name, s, default, False, description)


def boolean(name: str, default=None, description: str = "") -> Field:
    return Field(name, {"type": "boolean"}, default, False, description)


def string(name: str, default=None, description: str = "", required: bool = False, **schema) -> Field:
    return Field(name, {"type": "string", **schema}, default, required, description)


def _bounded(s: dict, lo, hi) -> dict:
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


def _or_null(s: dict) -> dict:
    if isinstance(s.get("type"), str) and "enum" not in s and "const" not in s:
        return {**s, "type": [s["type"], "null"]}
    if "anyOf" in s:
        return {**s, "anyOf": [*s["anyOf"], {"type": "null"}]}
    return {"anyOf": [s, {"type": "null"}]}


@dataclass
class Rule:
    """A constraint between fields: a body whose sent fields match `forbid` (a JSON Schema of the body) is a 400
    with `message`, naming `param`. Published as allOf [{not: forbid}] (no if/then: schema-driven generators such as
    schemathesis' give up on a body with more than a few of those)."""
    forbid: dict
    message: str
    param: str | Callable[[dict], str]        # or a function of the sent fields that names the one to blame


def both(*schemas: dict) -> dict:
    return {"allOf": list(schemas)}


def sent(*names: str) -> dict:
    """A body schema: each of names is sent and not null (null counts as absent)."""
    return {"required": list(names), "properties": {n: {"not": {"type": "null"}} for n in names}}


def sent_as(name: str, **schema) -> dict:
    """A body schema: name is sent, not null, and matches schema."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}, **schema}}}


def equals(name: str, value) -> dict:
    return {"required": [name], "properties": {name: {"const": value}}}


class Body:
    """One request body. alternatives: groups of which at least one must be sent (published as anyOf); rules:
    constraints between fields (Rule). served_model: its `model` names a served model (the document lists them);
    False for the store's names."""

    def __init__(self, name: str, fields: Sequence[Field], description: str = "",
                 alternatives: Sequence[Sequence[str]] = (), served_model: bool = True, rules: Sequence[Rule] = ()):
        self.name, self.description, self.served_model = name, description, served_model
        self.fields = {f.name: f for f in fields}
        assert len(self.fields) == len(fields), f"{name}: a field is declared twice"
        self.alternatives = [list(a) for a in alternatives]
        self.rules = list(rules)

    def read(self, body: dict) -> dict[str, Any]:
        """{name: value} for every declared field (the default where absent or null), each checked."""
        out = {}
        for f in self.fields.values():
            v = body.get(f.name)
            if v is None:
                if f.required:
                    raise bad_request(f"{f.name} is required" + (f": {f.description}" if f.description else ""),
                                      param=f.name)
                out[f.name] = f.default
                continue
            out[f.name] = f.check(v)
        if self.alternatives and not any(all(out[n] is not None for n in a) for a in self.alternatives):
            names = " or ".join(", ".join(a) for a in self.alternatives)
            raise bad_request(f"send {names}", param=self.alternatives[0][0])
        given = {k: out[k] for k in self.fields if body.get(k) is not None}
        for r in self.rules:
            if _Validator(r.forbid).is_valid(given):
                raise bad_request(r.message, param=r.param(given) if callable(r.param) else r.param)
        return out

    def schema(self, extra: dict[str, dict] | None = None, bounds: dict[str, int] | None = None) -> dict:
        """The body's JSON Schema; extra: name -> keywords added to that field's schema (e.g. the served models
        as the enum of `model`, known only at request time); bounds: the served model's limits (BOUND)."""
        extra = {k: v for k, v in (extra or {}).items() if k != "model" or self.served_model}
        s = {"type": "object", "properties": {n: f.published(extra.get(n), bounds) for n, f in self.fields.items()}}
        required = [n for n, f in self.fields.items() if f.required]
        if required:
            s["required"] = required
        if self.alternatives:           # each sent and not null (null counts as absent)
            s["anyOf"] = [sent(*a) for a in self.alternatives]
        if self.rules:
            s["allOf"] = [{"not": r.forbid, "description": r.message} for r in self.rules]
        if self.description:
            s["description"] = self.description
        return s


# ---------------------------------------------------------------- messages

def _param(name: str, err: ValidationError) -> str:
    """The field, dotted into declared properties of nested objects (and to an undeclared one sent to a closed
    object); not into lists or maps."""
    parts, path = [name], list(err.absolute_schema_path)[:-1]      # (the last is the keyword that failed)
    for i, kw in enumerate(path):
        if kw == "properties" and i + 1 < len(path):
            parts.append(str(path[i + 1]))
        elif i == 0 or path[i - 1] != "properties":
            if kw in _DESCENDING:
                return ".".join(parts)
    if err.validator == "additionalProperties" and err.validator_value is False:
        parts += sorted(set(err.instance) - set(err.schema.get("properties", {})))[:1]
    return ".".join(parts)


_DESCENDING = {"items", "prefixItems", "additionalProperties", "patternProperties", "propertyNames", "anyOf", "oneOf",
               "allOf", "if", "then", "else", "contains", "not", "dependentSchemas"}


def _where(name: str, err: ValidationError) -> str:
    out = name
    for p in err.absolute_path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _show(v) -> str:
    return json.dumps(v, ensure_ascii=False)[:60]


def _branch(err: ValidationError) -> ValidationError | None:
    """For an anyOf / oneOf failure: the error of the one alternative of the value's JSON type, if only one is."""
    by_branch: dict[int, list[ValidationError]] = {}
    for e in err.context or ():
        by_branch.setdefault(e.relative_schema_path[0], []).append(e)
    fits = [es for es in by_branch.values() if not any(e.validator == "type" and not e.relative_path for e in es)]
    return fits[0][0] if len(fits) == 1 else None


def _message(f: Field, err: ValidationError) -> str:
    if err.validator in ("anyOf", "oneOf") and (one := _branch(err)) is not None:
        return _message(f, one)
    where, v, kw, s = _where(f.name, err), err.instance, err.validator, err.schema
    if f.hint and not err.absolute_path:
        return f"{where} must be {f.hint}; got {_show(v)}"
    if kw == "type":
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        return f"{where} must be {' or '.join(_TYPES.get(t, t) for t in types)}; got {_show(v)}"
    if kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        lo = "[" if "minimum" in s else "(" if "exclusiveMinimum" in s else None
        hi = "]" if "maximum" in s else ")" if "exclusiveMaximum" in s else None
        lo_v, hi_v = s.get("minimum", s.get("exclusiveMinimum")), s.get("maximum", s.get("exclusiveMaximum"))
        if lo and hi:
            rng = f"in {lo}{lo_v}, {hi_v}{hi}"
        elif lo:
            rng = f"{'>=' if lo == '[' else '>'} {lo_v}"
        else:
            rng = f"{'<=' if hi == ']' else '<'} {hi_v}"
        return f"{where} must be {rng}; got {_show(v)}"
    if kw == "enum":
        return f"{where} must be one of {', '.join(_show(x) for x in s['enum'])}; got {_show(v)}"
    if kw == "const":
        return f"{where} must be {_show(s['const'])}; got {_show(v)}"
    if kw in ("minLength", "minItems", "minProperties") and err.validator_value == 1:
        return f"{where} must not be empty"
    if kw in ("minLength", "maxLength"):
        most = "at least" if kw == "minLength" else "at most"
        return f"{where} must have {most} {err.validator_value} characters; got {len(v)}"
    if kw in ("minItems", "maxItems", "maxProperties"):
        most = "at least" if kw == "minItems" else "at most"
        return f"{where} takes {most} {err.validator_value} entries; got {len(v)}"
    if kw == "required":
        missing = [r for r in err.validator_value if r not in v]
        return f"{where}.{missing[0]} is required"
    if kw == "additionalProperties":
        extra = sorted(set(v) - set(s.get("properties", {})))
        known = ", ".join(s.get("properties", {}))
        return f"{where} does not take {', '.join(extra)}" + (f"; it takes {known}" if known else "")
    if kw == "pattern":
        return f"{where} must match {err.validator_value}; got {_show(v)}"
    if kw == "propertyNames":
        return f"{where} keys must match {s['propertyNames'].get('pattern', 'the schema')}; got {err.message}"
    if kw == "not" and err.validator_value == {"type": "null"}:
        return f"{where} must not be null"
    if kw in ("anyOf", "oneOf") and s.get("description"):
        return f"{where} must be {s['description']}; got {_show(v)}"
    return f"{where}: {err.message}"
