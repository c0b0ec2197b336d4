"""A chat reply read as it is generated: text, or tool calls streamed the way OpenAI streams them.

A call is one JSON object, bare (what tool_choice "required" or a named function forces) or in Hermes-style
tags, which SmolLM2 and many templates use; several tagged calls may follow each other:

    {"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}}
    <tool_call>{"name": ..., "arguments": {...}}</tool_call> <tool_call>...</tool_call>

ToolCallParser.feed(text delta) returns the chunk deltas to send, in order:

    {"tool_calls": [{"index": i, "id": ..., "type": "function",      once the name (a declared tool) is read
                     "function": {"name": ..., "arguments": ""}}]}    and the arguments object has begun
    {"tool_calls": [{"index": i, "function": {"arguments": text}}]}   the arguments' text as it is generated
    {"content": text}                                                 a reply that is not a call (held back
                                                                      while it may still become one), or text
                                                                      after the calls

A non-streamed answer is what the same parser accumulates (`content`, `calls`), so streamed and non-streamed
replies agree. The arguments are the generated JSON text itself; under a forced call the grammar makes them
valid for the tool's schema; with tool_choice "auto" they are passed on as generated (OpenAI's advice holds:
check them before use).
"""
from __future__ import annotations

import json
from typing import Collection

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_WS = " \t\r\n"


class _ObjectScanner:
    """Scans one JSON object incrementally, from text[start:], noting its top-level keys' value spans.

    After advance(text): `pos` (scanned up to), `invalid` (not a JSON object of that shape), `done` (index just
    past the closing brace, or None), `spans` (key -> (start, end or None while the value is being read))."""

    def __init__(self, start: int):
        self.pos, self.depth = start, 0
        self.in_str = self.esc = False
        self.expect = "open"            # at depth 1: key | colon | value | scalar | comma; before it: open
        self.key_start = 0
        self.key: str | None = None
        self.spans: dict[str, list] = {}
        self.invalid = False
        self.done: int | None = None

    def advance(self, text: str) -> None:
        while self.pos < len(text) and not self.invalid and self.done is None:
            self._char(text, self.pos, text[self.pos])
            if not self.invalid:
                self.pos += 1

    def _char(self, text: str, i: int, c: str) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                if self.depth == 1 and self.expect == "key":
                    try:
                        self.key = json.loads(text[self.key_start:i + 1])
                    except ValueError:
                        self.invalid = True
                    self.expect = "colon"
                elif self.depth == 1:
                    self._end_value(i + 1)
            return
        if self.depth >= 2:                     # inside a nested value: only its nesting matters
            if c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 1:
                    self._end_value(i + 1)
            return
        if self.expect == "scalar":             # a number, true, false or null ends at , } or whitespace
            if c not in ",}" + _WS:
                return
            self._end_value(i)
        if c in _WS:
            return
        if self.expect == "open":
            self.depth, self.expect = (1, "key") if c == "{" else (0, "invalid")
            self.invalid = c != "{"
        elif self.expect == "key" and c == '"':
            self.in_str, self.key_start = True, i
        elif self.expect == "colon" and c == ":":
            self.expect = "value"
        elif self.expect == "value":
            self.spans[self.key] = [i, None]
            if c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth = 2
            else:
                self.expect = "scalar"
        elif c == "," and self.expect == "comma":
            self.expect = "key"
        elif c == "}" and self.expect in ("comma", "key"):
            self.depth, self.done = 0, i + 1
        else:
            self.invalid = True

    def _end_value(self, end: int) -> None:
        self.spans[self.key][1] = end
        self.expect = "comma"


class ToolCallParser:
    """One reply (one choice): feed() its text deltas, then finish(); `calls` and `content` accumulate."""

    def __init__(self, names: Collection[str], call_id: str):
        self.names, self.call_id = set(names), call_id
        self.calls: list[dict] = []      # OpenAI message.tool_calls items; the last one's arguments may grow
        self.content = ""                # text sent as content
        self._text = ""                  # everything fed
        self._at = 0                     # text before this is sent (as content) or read (as calls)
        self._mode = "lead"              # lead | call | between | text
        self._scan: _ObjectScanner | None = None
        self._committed = False          # the current call's first chunk is out
        self._sent = 0                   # its arguments text is sent up to here
        self._open = False               # it is in tags

    def feed(self, delta: str) -> list[dict]:
        self._text += delta
        out: list[dict] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[dict]:
        """The end of the reply: text still held (it never became a call) goes out as content; a call cut off
        (max_tokens) stays as far as it got; a partial tag is dropped."""
        out: list[dict] = []
        if self._mode == "lead" or (self._mode == "call" and not self._committed):
            self._to_text(out)
        return out

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason

    def message(self) -> dict:
        """The non-streamed message: content, and tool_calls when there are calls (content then null if empty)."""
        if not self.calls:
            return {"role": "assistant", "content": self.content}
        return {"role": "assistant", "content": self.content or None, "tool_calls": self.calls}

    # ------------------------------------------------ the states
    def _step(self, out: list[dict]) -> bool:
        """One transition on the text held; False when it must wait for more text."""
        rest = self._text[self._at:]
        if self._mode == "text":
            if rest:
                self._content(rest, out)
            return False
        if self._mode == "call":
            return self._read_call(out)
        s = rest.lstrip(_WS)
        lead = len(rest) - len(s)
        if self._mode == "lead" and s.startswith("{"):
            self._begin_call(self._at + lead, tagged=False)
            return True
        if s.startswith(OPEN):
            self._begin_call(self._at + lead + len(OPEN), tagged=True)
            return True
        if self._mode == "between" and self._open and s.startswith(CLOSE):
            self._at += lead + len(CLOSE)
            self._open = False
            return True
        if not s or OPEN.startswith(s) or (self._mode == "between" and CLOSE.startswith(s)):
            return False
        self._to_text(out)
        return False

    def _begin_call(self, start: int, tagged: bool) -> None:
        self._mode, self._open = "call", tagged
        self._scan, self._committed = _ObjectScanner(start), False

    def _read_call(self, out: list[dict]) -> bool:
        sc = self._scan
        sc.advance(self._text)
        name, args = sc.spans.get("name"), sc.spans.get("arguments")
        if not self._committed:
            ready = name is not None and name[1] is not None and args is not None
            if not self._could_be_call(sc) or (sc.done is not None and not ready):
                self._to_text(out)
                return False
            if not ready:
                return False            # the name, or the start of the arguments, is still to come
            self._committed, self._sent = True, args[0]
            index, fn = len(self.calls), json.loads(self._text[name[0]:name[1]])
            call_id = f"call_{self.call_id}_{index}"
            self.calls.append({"id": call_id, "type": "function", "function": {"name": fn, "arguments": ""}})
            out.append({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                        "function": {"name": fn, "arguments": ""}}]})
        upto = args[1] if args[1] is not None else sc.pos
        if upto > self._sent:
            fragment = self._text[self._sent:upto]
            self._sent = upto
            self.calls[-1]["function"]["arguments"] += fragment
            out.append({"tool_calls": [{"index": len(self.calls) - 1, "function": {"arguments": fragment}}]})
        if sc.invalid:                 # a call broken after its arguments: the rest is text
            self._at, self._mode = sc.pos, "text"
            return True
        if sc.done is None:
            return False
        self._at, self._mode, self._scan = sc.done, "between", None
        return True

    def _could_be_call(self, sc: _ObjectScanner) -> bool:
        """Before anything of a call is sent: still {"name": <a declared tool>, "arguments": {...}} so far."""
        if sc.invalid or set(sc.spans) - {"name", "arguments"}:
            return False
        name, args = sc.spans.get("name"), sc.spans.get("arguments")
        if name is not None:
            if self._text[name[0]] != '"':
                return False
            if name[1] is not None:
                try:
                    if json.loads(self._text[name[0]:name[1]]) not in self.names:
                        return False
                except ValueError:
                    return False
        return args is None or self._text[args[0]] == "{"

    def _to_text(self, out: list[dict]) -> None:
        self._mode = "text"
        rest = self._text[self._at:]
        if rest:
            self._content(rest, out)

    def _content(self, text: str, out: list[dict]) -> None:
        self._at += len(text)
        self.content += text
        out.append({"content": text})
