"""protocol/harmony.py against openai-harmony's StreamableParser on the same token sequences (rendered by
openai-harmony): the reply's ids through the runtime's own detokenizer (o200k_harmony, harmony's markers kept, the
stop ids ending it), token by token and whole; the reasoning and content runs equal the parser's analysis and
final / commentary text, in order, and a message to a function is the request's tool call."""
from __future__ import annotations

import json

import pytest

from ortllm.pipeline.tiktoken_vocab import HARMONY_EOS
from ortllm.protocol.harmony import HarmonyReply
from ortllm.protocol.structured import parse_tools
from ortllm.runtime.detokenizer import IncrementalDetokenizer
from ortllm.runtime.tokenizer import Tokenizer

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]

# a reply: (channel, text, recipient or None); the last message ends with <|return|> (<|call|> for a call)
REPLIES = {
    "analysis_final": [("analysis", "The user asks 2 + 2. That is 4.", None), ("final", "2 + 2 = 4.", None)],
    "final_only": [("final", "Hello! How can I help?", None)],
    "multibyte": [("analysis", "日本語で答える 🙂👍🏽 — naïve", None), ("final", "こんにちは 👨‍👩‍👧 Ünïcödé", None)],
    "near_markers": [("analysis", "a < b, x <|en y, |> and <| then <|end", None),
                     ("final", "if a<b and c>|d: print('<|')", None)],
    "preamble": [("analysis", "Plan: say hi first.", None), ("commentary", "One moment.", None),
                 ("final", "Done.", None)],
    "whitespace": [("analysis", "\n\n  spaced\t\tout  \n", None), ("final", "   \n", None)],
    "tool_call": [("analysis", "Need the weather; call the tool.", None),
                  ("commentary", '{"city": "Paris"}', "functions.get_weather")],
}


@pytest.fixture(scope="module")
def tok(harmony_tokenizer_dir):
    return Tokenizer.from_dir(harmony_tokenizer_dir)


def reply_ids(enc, reply) -> list[int]:
    """openai-harmony's rendering of the assistant's messages, as the model generates them after the prompt's
    <|start|>assistant: the first message without those two tokens, the last ending at its stop token."""
    import openai_harmony as h
    ids = []
    for channel, text, recipient in reply:
        m = h.Message.from_role_and_content(h.Role.ASSISTANT, text).with_channel(channel)
        if recipient:
            m = m.with_recipient(recipient).with_content_type("<|constrain|>json")
        ids += enc.render(m)
    assert ids[:2] == enc.encode("<|start|>assistant", allowed_special="all")
    ids = ids[2:]
    if ids[-1] == 200007:                       # <|end|>: the model ends its last message with <|return|>
        ids[-1] = 200002
    return ids


def harmony_runs(enc, ids: list[int]) -> tuple[list[tuple[str, str]], list]:
    """StreamableParser over ids, token by token: its deltas as (channel, text) runs; its parsed messages."""
    import openai_harmony as h
    p = h.StreamableParser(enc, role=h.Role.ASSISTANT)
    runs: list[tuple[str, str]] = []
    for t in ids:
        p.process(t)
        if p.last_content_delta:
            key = "call" if p.current_recipient else p.current_channel
            if runs and runs[-1][0] == key:
                runs[-1] = (key, runs[-1][1] + p.last_content_delta)
            else:
                runs.append((key, p.last_content_delta))
    return runs, p.messages


def ours(tok, ids: list[int], tools=None, whole: bool = False) -> tuple[HarmonyReply, list[dict]]:
    """The runtime's detokenizer over ids (context: the prompt's <|start|>assistant), its text deltas into a
    HarmonyReply: token by token, or the finished text at once."""
    prompt = tok.encode("<|start|>assistant")
    detok = IncrementalDetokenizer(tok.decode, prompt, stop_token_ids=HARMONY_EOS, stream=tok.decode_stream)
    reply = HarmonyReply(tools.reader("t") if tools else None)
    deltas: list[dict] = []
    pieces = [detok.step([t]) for t in ids] + [detok.flush()]
    assert detok.finished                  # at <|return|> / <|call|>
    for text in ["".join(pieces)] if whole else pieces:
        deltas += reply.feed(text)
    return reply, deltas + reply.finish()


def _runs(deltas: list[dict]) -> list[tuple[str, str]]:
    key_of = {"reasoning_content": "analysis", "content": "final"}
    runs: list[tuple[str, str]] = []
    for d in deltas:
        for k, v in d.items():
            if k in key_of and v:
                if runs and runs[-1][0] == key_of[k]:
                    runs[-1] = (key_of[k], runs[-1][1] + v)
                else:
                    runs.append((key_of[k], v))
    return runs


@pytest.mark.parametrize("whole", [False, True], ids=["streamed", "whole"])
@pytest.mark.parametrize("name", [n for n in REPLIES if n != "tool_call"])
def test_channels_equal_streamable_parser(tok, harmony_encoding, name, whole):
    ids = reply_ids(harmony_encoding, REPLIES[name])
    theirs, messages = harmony_runs(harmony_encoding, ids)
    reply, deltas = ours(tok, ids, whole=whole)
    # commentary without a recipient is shown as content, as final is
    assert _runs(deltas) == [("final" if c == "commentary" else c, t) for c, t in _merge_channels(theirs)]
    assert reply.reasoning == "".join(m.content[0].text for m in messages if m.channel == "analysis")
    assert reply.content == "".join(m.content[0].text for m in messages if m.channel != "analysis")
    assert reply.message() == {"role": "assistant", "content": reply.content,
                               **({"reasoning_content": reply.reasoning} if reply.reasoning else {})}


def _merge_channels(runs):
    """Runs of commentary next to final are one content run for us."""
    out: list[tuple[str, str]] = []
    for c, t in runs:
        c2 = "final" if c == "commentary" else c
        if out and out[-1][0] == c2:
            out[-1] = (c2, out[-1][1] + t)
        else:
            out.append((c2, t))
    return out


@pytest.mark.parametrize("whole", [False, True], ids=["streamed", "whole"])
def test_a_message_to_a_function_is_a_tool_call(tok, harmony_encoding, whole):
    ids = reply_ids(harmony_encoding, REPLIES["tool_call"])
    assert ids[-1] == 200012                       # <|call|>
    theirs, messages = harmony_runs(harmony_encoding, ids)
    call = messages[-1]
    assert call.recipient == "functions.get_weather" and call.content_type == "<|constrain|>json"
    reply, deltas = ours(tok, ids, parse_tools(WEATHER, "auto"), whole=whole)
    assert reply.reasoning == messages[0].content[0].text
    assert [c["function"]["name"] for c in reply.calls] == ["get_weather"]
    assert json.loads(reply.calls[0]["function"]["arguments"]) == json.loads(call.content[0].text)
    assert reply.finish_reason("stop") == "tool_calls"
    msg = reply.message()
    assert msg["content"] is None and msg["reasoning_content"] == reply.reasoning and msg["tool_calls"]
    assert any("tool_calls" in d for d in deltas)


def test_cut_short(tok, harmony_encoding):
    """A reply stopped by max_tokens inside its final message: what the parser has of it."""
    import openai_harmony as h
    ids = reply_ids(harmony_encoding, REPLIES["analysis_final"])[:-3]
    p = h.StreamableParser(harmony_encoding, role=h.Role.ASSISTANT)
    for t in ids:
        p.process(t)
    detok = IncrementalDetokenizer(tok.decode, tok.encode("<|start|>assistant"), stream=tok.decode_stream)
    reply = HarmonyReply()
    for t in ids:
        reply.feed(detok.step([t]))
    reply.feed(detok.flush())
    reply.finish()
    assert (reply.reasoning, reply.content) == (p.messages[0].content[0].text, p.current_content)


@pytest.mark.parametrize("text", ["Just plain text, no harmony at all.", "x" * 300, ""])
def test_a_reply_without_harmony_is_content(text):
    reply = HarmonyReply()
    deltas = [d for i in range(0, len(text), 7) for d in reply.feed(text[i:i + 7])] + reply.finish()
    assert "".join(d["content"] for d in deltas) == text == reply.content and not reply.reasoning
