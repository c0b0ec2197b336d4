"""openai-harmony (OpenAI's renderer and parser of the harmony format) and tiktoken's o200k_harmony, offline: both
read o200k_base's ranks from the `bpe-openai` wheel's copy, never from the network.

openai-harmony's Rust core loads `o200k_base.tiktoken` from the directory TIKTOKEN_ENCODINGS_BASE names (else it
downloads it); tiktoken's o200k_harmony() takes its ranks from load_tiktoken_bpe (a download), given the same ranks
here instead.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

# A harmony reply forced on a random model (guided_grammar, a Lark grammar llguidance runs): its analysis and
# final channels' text
REASONING = "Two plus two: 2 + 2 = 4 ✓ (日本語 too)."
ANSWER = "The answer is 4."
FORCED_REPLY = (f'start: <|channel|> "analysis" <|message|> {json.dumps(REASONING, ensure_ascii=False)} <|end|> '
                f'<|start|> "assistant" <|channel|> "final" <|message|> {json.dumps(ANSWER)}')


def harmony_encoding(tmp_dir: Path):
    """openai-harmony's HARMONY_GPT_OSS encoding, its vocabulary the wheel's o200k_base unzipped into tmp_dir."""
    import openai_harmony

    from ortllm.pipeline.tiktoken_vocab import o200k_base_file
    tmp_dir.mkdir(parents=True, exist_ok=True)
    (tmp_dir / "o200k_base.tiktoken").write_bytes(gzip.decompress(o200k_base_file().read_bytes()))
    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(tmp_dir)
    try:
        return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if before is None:
            del os.environ["TIKTOKEN_ENCODINGS_BASE"]
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


def tiktoken_o200k_harmony():
    """tiktoken's own o200k_harmony definition (tiktoken_ext.openai_public: its pattern and special tokens) over the
    wheel's ranks: (tiktoken.Encoding, the definition's dict)."""
    import tiktoken
    from tiktoken_ext import openai_public

    from ortllm.pipeline.tiktoken_vocab import o200k_base_file, read_tiktoken_ranks
    ranks = read_tiktoken_ranks(o200k_base_file())
    real = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *a, **k: ranks
    try:
        spec = openai_public.o200k_harmony()
    finally:
        openai_public.load_tiktoken_bpe = real
    return tiktoken.Encoding(**spec), spec


def harmony_prompt_ids(enc, conv: list[dict], effort: str | None, reasoning: bool = True) -> list[int]:
    """openai-harmony's rendering of an OpenAI-style conversation; an assistant turn with "reasoning" is an analysis
    message then a final one (as the model wrote it), or the final alone (reasoning=False)."""
    import openai_harmony as h
    system = h.SystemContent.new()
    if effort is not None:
        system = system.with_reasoning_effort(h.ReasoningEffort(effort.capitalize()))
    msgs = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]
    for m in conv:
        if m["role"] in ("system", "developer"):
            msgs.append(h.Message.from_role_and_content(
                h.Role.DEVELOPER, h.DeveloperContent.new().with_instructions(m["content"])))
        elif m["role"] == "user":
            msgs.append(h.Message.from_role_and_content(h.Role.USER, m["content"]))
        else:
            if m.get("reasoning") and reasoning:
                msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, m["reasoning"])
                            .with_channel("analysis"))
            msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, m["content"]).with_channel("final"))
    return enc.render_conversation_for_completion(h.Conversation.from_messages(msgs), h.Role.ASSISTANT)


def make_gpt_oss_artifact(out: Path, tokenizer_dir: Path) -> None:
    """tests/reference/hf_families.py's tiny gpt-oss with o200k_harmony's 201088 rows and its stop ids, its HF
    directory given o200k_harmony's files (as pipeline/tiktoken_vocab.py writes them for a gpt-oss directory
    without any), built fp32 into out."""
    from ortllm.cli.build import build_artifact
    from ortllm.pipeline.build import BuildOptions
    from ortllm.pipeline.tiktoken_vocab import HARMONY_EOS
    from tests.reference.hf_families import tiny_model

    model = tiny_model("gpt_oss", seed=0, vocab_size=201088, max_position_embeddings=512, bos_token_id=199998,
                       eos_token_id=list(HARMONY_EOS), pad_token_id=199999)
    hf = out.with_name(out.name + "-hf")
    model.save_pretrained(hf, safe_serialization=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, hf / f.name)
    build_artifact(str(hf), out, BuildOptions(), log=lambda m: None)
    shutil.rmtree(hf)
