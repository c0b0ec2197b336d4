"""A gpt-oss reply in the harmony format, as the chat APIs return it: the analysis channel as reasoning, the final
channel as the answer (vLLM's gpt-oss reasoning parser and Ollama's `thinking` do the same).

The reply's text as the runtime decodes it for a harmony tokenizer (runtime/tokenizer.py keeps the markers):

    <|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final<|message|>{answer}
    (the prompt ends with <|start|>assistant; generation stops at <|return|> or <|call|>, never in the text)

    HarmonyReply.feed(text delta) -> [{"reasoning_content": ...} | {"content": ...} | tool-call deltas]
    HarmonyReply.finish()         -> what was held back

A message's header (between <|start|> and <|message|>) names its channel and, for a tool call, its recipient
("to=functions.NAME"): analysis -> reasoning_content; final and commentary -> content; a message to a recipient is
a call of that function with its body as the arguments, given to the request's tool-call parser (tool_calls.py) as
the {"name": ..., "arguments": ...} object it reads, so calls stream and finish as for any model; without tools
its body is content. Text is held only while it could still be a marker (a suffix that begins "<|end|>") or
while a header is incomplete; a reply that does not begin with a header (a model that ignores the format) is
content as it came, once HEADER_MAX characters pass without <|message|> or the reply ends. Checked against
openai-harmony's StreamableParser, whole and token by token (tests/protocol/test_harmony.py).
"""
from __future__ import annotations

import json
import re

from ortllm.runtime.tokenizer import HARMONY_MARKERS

START, CHANNEL, MESSAGE, END, CONSTRAIN = HARMONY_MARKERS
HEADER_MAX = 256                 # characters a header may take before the text is read as plain content
_RECIPIENT = re.compile(r"to=(\S+?)(?=<\||\s|$)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
# channel -> the chat delta key its text goes to
CHANNEL_KEYS = {"analysis": "reasoning_content", "final": "content", "commentary": "content"}


def _held(text: str, marker: str) -> int:
    """How many trailing characters of text could be the start of marker (held until the next delta)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class HarmonyReply:
    """One reply (one choice): feed() its text deltas, then finish(). tools: the request's tool-call parser
    (None: no tools). reasoning and content accumulate what was sent."""

    def __init__(self, tools=None):
        self.tools = tools
        self.reasoning = ""
        self.content = ""
        self._buf = ""                  # text not yet read
        self._state = "header"          # header | body | between | plain
        self._key = "content"           # the current message's delta key ("call": a tool call's arguments)
        self._call: tuple[str, str] | None = None   # (function name, arguments so far) of a message to a recipient

    # ------------------------------------------------ the reply's text in
    def feed(self, delta: str) -> list[dict]:
        self._buf += delta
        out: list[dict] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[dict]:
        """The end of the reply: a body's held text is sent; an unfinished header is content if the reply never
        had one (plain text), else dropped; a pending call goes to the tool-call parser."""
        out: list[dict] = []
        if self._state in ("body", "plain"):
            self._emit(self._buf, out)
        elif self._state == "header" and not self.content and not self.reasoning:
            self._state = "plain"
            self._emit(self._buf, out)
        self._buf = ""
        self._end_message(out)
        if self.tools is not None:
            out += self._tool_deltas(self.tools.finish())
        return out

    # ------------------------------------------------ the answer
    def finish_reason(self, reason: str) -> str:
        return self.tools.finish_reason(reason) if self.tools is not None else reason

    def message(self) -> dict:
        """The non-streamed message: content (null with tool calls and no text), reasoning_content when there is
        reasoning, tool_calls when there are calls."""
        msg = self.tools.message() if self.tools is not None else {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        return msg

    @property
    def calls(self) -> list[dict]:
        return self.tools.calls if self.tools is not None else []

    # ------------------------------------------------ the states
    def _step(self, out: list[dict]) -> bool:
        """One transition on the text held; False when it must wait for more text."""
        buf = self._buf
        if self._state == "plain":
            self._emit(buf, out)
            self._buf = ""
            return False
        if self._state == "between":          # after <|end|>: the next message's <|start|>
            if buf.startswith(START):
                self._buf, self._state = buf[len(START):], "header"
                return True
            if START.startswith(buf):
                return False
            self._state = "plain"             # text outside a message: shown as it came
            return True
        if self._state == "header":
            at = buf.find(MESSAGE)
            if at < 0:
                if len(buf) > HEADER_MAX:
                    self._state = "plain"
                    return True
                return False
            self._begin_message(buf[:at])
            self._buf, self._state = buf[at + len(MESSAGE):], "body"
            return True
        at = buf.find(END)                     # body: up to <|end|>
        if at >= 0:
            self._emit(buf[:at], out)
            self._end_message(out)
            self._buf, self._state = buf[at + len(END):], "between"
            return True
        keep = _held(buf, END)
        self._emit(buf[:len(buf) - keep], out)
        self._buf = buf[len(buf) - keep:]
        return False

    def _begin_message(self, header: str) -> None:
        """A header: [role] [to=RECIPIENT] <|channel|>NAME [to=RECIPIENT] [<|constrain|>TYPE]."""
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL_NAME.search(header)
        name = channel.group(1) if channel else "final"
        if recipient is not None and self.tools is not None:
            fn = recipient.group(1)
            self._key, self._call = "call", (fn.split(".", 1)[1] if fn.startswith("functions.") else fn, "")
        else:
            self._key = CHANNEL_KEYS.get(name, "content")

    def _emit(self, text: str, out: list[dict]) -> None:
        if not text:
            return
        if self._key == "call":
            name, args = self._call
            self._call = (name, args + text)
        elif self._key == "reasoning_content":
            self.reasoning += text
            out.append({"reasoning_content": text})
        else:
            self._content(text, out)

    def _end_message(self, out: list[dict]) -> None:
        """A call's message ended (<|end|>, or the reply at <|call|>): its object to the tool-call parser."""
        if self._call is not None:
            name, args = self._call
            try:
                args_obj = json.loads(args) if args.strip() else {}
            except ValueError:
                args_obj = args          # as OpenAI: the arguments as they came, when the model's are not JSON
            self._call = None
            self._content(json.dumps({"name": name, "arguments": args_obj}, ensure_ascii=False), out)
        self._key = "content"

    def _content(self, text: str, out: list[dict]) -> None:
        if self.tools is None:
            self.content += text
            out.append({"content": text})
        else:
            out += self._tool_deltas(self.tools.feed(text))

    def _tool_deltas(self, deltas: list[dict]) -> list[dict]:
        for d in deltas:
            self.content += d.get("content") or ""
        return deltas
