"""`ortllm run` on a gpt-oss (harmony) artifact: the reply's reasoning shown between "Thinking..." and "...done
thinking." as `ollama run` shows it, the answer after it, and the history keeping the answer alone, so the next
turn's prompt is openai-harmony's rendering of the conversation. A random model does not speak harmony: the
reply is forced by a Lark grammar (tests/reference/harmony_ref.py FORCED_REPLY) on the real engine."""
from __future__ import annotations

import dataclasses
import io

from ortllm.cli.run import Chat, ChatOptions
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import Guide
from tests.reference.harmony_ref import ANSWER, FORCED_REPLY, REASONING, harmony_prompt_ids


@dataclasses.dataclass
class ForcedOptions(ChatOptions):
    """ChatOptions whose replies follow FORCED_REPLY (the CLI has no grammar flag)."""

    def params(self):
        return dataclasses.replace(super().params(), guide=Guide("lark", FORCED_REPLY, "guided_grammar"))


def test_thinking_shown_and_the_answer_kept(gpt_oss_harmony_artifact, harmony_encoding):
    out = io.StringIO()
    with Engine.from_artifact(gpt_oss_harmony_artifact, num_blocks=64) as engine:
        chat = Chat(engine, ForcedOptions(temperature=0, max_tokens=64), out)
        assert chat.reply("What is 2 + 2?") == ANSWER
        assert out.getvalue() == f"Thinking...\n{REASONING}\n...done thinking.\n\n{ANSWER}\n"
        assert chat.history == [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": ANSWER}]
        conv = [*chat.history, {"role": "user", "content": "And 3 + 3?"}]
        assert chat.prompt_ids("And 3 + 3?") == harmony_prompt_ids(harmony_encoding, conv, None)
