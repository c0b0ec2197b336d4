"""gpt-oss's chat template: a conversation rendered in the harmony format, written into a gpt-oss artifact whose
source has no template (pipeline/tiktoken_vocab.py; pipeline/tokenizer.py for an HF directory without one).

What it renders, token for token what openai-harmony's render_conversation_for_completion gives for the same
conversation with its default system content (tests/pipeline/test_harmony_template.py):

    <|start|>system<|message|>{model identity}\\nKnowledge cutoff: 2024-06\\n\\nReasoning: {effort}\\n\\n
        # Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>
    a system or developer message  <|start|>developer<|message|># Instructions\\n\\n{content}<|end|>
    a user message                 <|start|>user<|message|>{content}<|end|>
    an assistant message           <|start|>assistant<|channel|>final<|message|>{content}<|end|>
                                   (its reasoning is not rendered: harmony drops the analysis of answered turns)
    the generation prompt          <|start|>assistant

Variables beyond transformers' own: reasoning_effort ("low" | "medium" | "high"; default "medium": the OpenAI chat
field of that name), model_identity. No "Current date" line (openai-harmony writes one only when given a date).
Tool definitions and tool results are not rendered in harmony's form: a tool message is refused with a message
saying so, and the service describes tools in the system message as for any template without them.
"""
from __future__ import annotations

HARMONY_TEMPLATE = (
    "{#- harmony, gpt-oss's chat format (ortllm's rendering; see pipeline/harmony_template.py) -#}\n"
    "{%- set identity = model_identity if model_identity is defined and model_identity else "
    "'You are ChatGPT, a large language model trained by OpenAI.' -%}\n"
    "{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else 'medium' -%}\n"
    "{%- if effort not in ('low', 'medium', 'high') -%}"
    "{{- raise_exception('reasoning_effort must be low, medium or high; got ' + effort|string) -}}"
    "{%- endif -%}\n"
    "{{- '<|start|>system<|message|>' + identity + '\\nKnowledge cutoff: 2024-06\\n\\nReasoning: ' + effort"
    " + '\\n\\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>' -}}\n"
    "{%- for m in messages -%}\n"
    "{%- if m.role in ('system', 'developer') -%}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + m.content + '<|end|>' -}}"
    "{%- elif m.role == 'user' -%}"
    "{{- '<|start|>user<|message|>' + m.content + '<|end|>' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' -}}"
    "{%- else -%}"
    "{{- raise_exception('a ' + m.role + ' message has no harmony rendering here; send system, developer, user "
    "and assistant messages') -}}"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}\n"
)
