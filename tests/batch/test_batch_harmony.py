"""`ortllm batch` on a gpt-oss (harmony) artifact: a chat line's message is split as the service splits it,
reasoning_content and content; a completion line keeps the raw text. The reply is forced by a Lark grammar
(tests/reference/harmony_ref.py FORCED_REPLY) on the real engine."""
from __future__ import annotations

import json

from ortllm.batch import BatchOptions, run_batch
from tests.batch.conftest import read_output, write_lines
from tests.reference.harmony_ref import ANSWER, FORCED_REPLY, REASONING


def test_chat_lines_split_by_channel(gpt_oss_harmony_artifact, tmp_path):
    forced = {"max_tokens": 64, "temperature": 0, "guided_grammar": FORCED_REPLY}
    lines = [json.dumps({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": "What is 2 + 2?"}], **forced}}),
             json.dumps({"custom_id": "text", "method": "POST", "url": "/v1/completions",
                         "body": {"prompt": "<|start|>user<|message|>hi<|end|><|start|>assistant", **forced}})]
    out = tmp_path / "out.jsonl"
    run_batch(gpt_oss_harmony_artifact, write_lines(tmp_path / "in.jsonl", lines), out,
              BatchOptions(progress=False))
    got = {x["custom_id"]: x["response"]["body"]["choices"][0] for x in read_output(out)}
    assert got["chat"]["message"] == {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING}
    assert got["text"]["text"] == (f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant"
                                   f"<|channel|>final<|message|>{ANSWER}")
