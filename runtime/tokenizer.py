"""Runtime tokenizer: encode, decode and chat templates over an artifact's tokenizer files.

Base install only (no torch, no transformers). Backend: the `tokenizers` library over tokenizer.json;
bench/probes/measure_tokenizers.py compares it with onnxruntime-extensions (identical on our byte-level BPE,
slower per call, see the pipeline's tokenizer_graphs.py). Semantics follow transformers' fast
tokenizers: special tokens written in the text (``<|im_start|>``) are matched as specials,
``encode`` adds BOS/EOS only when asked and the tokenizer.json says so, ``apply_chat_template`` renders
in a sandboxed jinja2 environment with the same globals and filters as transformers.

Harmony (gpt-oss's format, a tokenizer with HARMONY_MARKERS): decoding keeps those markers in the text, the other
special tokens skipped as ever, so a reply reads ``<|channel|>analysis<|message|>...<|end|><|start|>assistant
<|channel|>final<|message|>...`` and the chat APIs split its channels (protocol/harmony.py).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.decoders import DecodeStream

from .contract import TOKENIZER as TOKENIZER_JSON
from .contract import TOKENIZER_CONFIG
from .errors import OrtllmError


# the special tokens that frame a harmony message: kept in decoded text (<|return|> and <|call|> end generation)
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")


class TokenizerFilesError(OrtllmError, ValueError):
    """The tokenizer files are missing or unreadable; the message says what to do."""


def token_content(value) -> str | None:
    """A special token in tokenizer_config.json: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _clean_up_tokenization(text: str) -> str:
    """transformers' clean_up_tokenization, applied when the config asks for it."""
    for old, new in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                     (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(old, new)
    return text


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # As transformers: no HTML escaping, unlike jinja2's built-in tojson.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def read_chat_template(path: Path, config: dict) -> str | None:
    """A tokenizer dir's chat template: tokenizer_config.json, else chat_template.jinja / .json."""
    template = config.get("chat_template")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (path / "chat_template.json").is_file():
        template = json.loads((path / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # named templates
        template = {t.get("name"): t.get("template") for t in template}.get("default")
    return template


class RustDecodeStream:
    """tokenizers' DecodeStream bound to its tokenizer, special tokens skipped as in Tokenizer.decode (hidden: the
    ids skipped when the others are shown, harmony's case; None: every special token skipped)."""

    def __init__(self, backend: _HFTokenizer, context_ids: list[int], hidden: frozenset[int] | None = None):
        self._tok, self._hidden = backend, hidden
        if hidden is not None:
            context_ids = [i for i in context_ids if i not in hidden]
        self._ds = DecodeStream(ids=list(context_ids), skip_special_tokens=hidden is None)

    def step(self, token_id: int) -> str | None:
        if self._hidden is not None and int(token_id) in self._hidden:
            return None
        return self._ds.step(self._tok, int(token_id))


class Tokenizer:
    """Text <-> token ids for one artifact (thread-safe for encode/decode)."""

    def __init__(self, backend: _HFTokenizer, config: dict, chat_template: str | None = None,
                 extra_eos_ids: tuple[int, ...] = ()):
        self._tok = backend
        self._config = config
        self.chat_template = chat_template
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        self._special_tokens = {
            key: token_content(config.get(key)) for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        eos = self._id_of(self._special_tokens["eos_token"])
        self._eos_ids = tuple(dict.fromkeys(([eos] if eos is not None else []) + list(extra_eos_ids)))
        markers = [backend.token_to_id(t) for t in HARMONY_MARKERS]
        self.harmony = all(i is not None for i in markers)      # gpt-oss's format: its markers stay in the text
        # harmony: the special tokens decode skips (every one but the markers); None: skip_special_tokens as asked
        self._hidden: frozenset[int] | None = frozenset(
            i for i, t in backend.get_added_tokens_decoder().items() if t.special and i not in markers
        ) if self.harmony else None

    @classmethod
    def from_dir(cls, path) -> "Tokenizer":
        """Load tokenizer.json + tokenizer_config.json (+ chat_template.jinja, generation_config.json)."""
        path = Path(path)
        missing = [n for n in (TOKENIZER_JSON, TOKENIZER_CONFIG) if not (path / n).is_file()]
        if missing:
            raise TokenizerFilesError(
                f"{path} lacks {' and '.join(missing)}; rebuild the artifact with `ortllm build`")
        try:
            backend = _HFTokenizer.from_file(str(path / TOKENIZER_JSON))
            config = json.loads((path / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
        except Exception as e:
            raise TokenizerFilesError(f"cannot read the tokenizer in {path} ({e}); rebuild the artifact") from e
        extra_eos: list[int] = []
        gen_path = path / "generation_config.json"
        if gen_path.is_file():
            ids = json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id")
            extra_eos = [int(i) for i in (ids if isinstance(ids, list) else [ids]) if i is not None]
        return cls(backend, config, read_chat_template(path, config), tuple(extra_eos))

    # ------------------------------------------------------------------------------- encode / decode

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; specials written in the text are recognized. BOS/EOS only when asked."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """skip_special_tokens: without the special tokens (harmony's markers kept: see the module docstring)."""
        ids = [int(i) for i in ids]
        if skip_special_tokens and self._hidden is not None:
            ids, skip_special_tokens = [i for i in ids if i not in self._hidden], False
        text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up else text

    def decode_stream(self, context_ids: list[int]):
        """An incremental decoder of what decode gives, started after context_ids (detokenizer.TokenStream), or
        None where decode cleans up spaces afterwards (not a per-token operation)."""
        return None if self._clean_up else RustDecodeStream(self._tok, context_ids, self._hidden)

    # ---------------------------------------------------------------------------------- chat template

    @cached_property
    def _template(self) -> jinja2.Template:
        if not self.chat_template:
            raise TokenizerFilesError("this tokenizer has no chat template; send plain prompts (no --chat)")
        return _compile_template(self.chat_template)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, reasoning_effort: str | None = None) -> str:
        """The prompt text for a conversation, as transformers' apply_chat_template(tokenize=False).
        tools: OpenAI tool definitions, for templates that render them (see template_takes_tools).
        reasoning_effort: the template variable of that name where given (harmony's `Reasoning:` line)."""
        additional = self._config.get("additional_special_tokens") or []
        extra = {"reasoning_effort": reasoning_effort} if reasoning_effort is not None else {}
        return self._template.render(
            messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **extra,
            additional_special_tokens=[token_content(t) for t in additional],
            **{k: v for k, v in self._special_tokens.items() if v is not None},
        )

    @property
    def template_takes_tools(self) -> bool:
        """The chat template renders a `tools` list itself (else the service describes them in a system message)."""
        return bool(self.chat_template) and "tools" in self.chat_template

    # ------------------------------------------------------------------------------------- vocabulary

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of(self._special_tokens["bos_token"])

    @property
    def pad_token_id(self) -> int | None:
        return self._id_of(self._special_tokens["pad_token"])

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def _id_of(self, token: str | None) -> int | None:
        return self._tok.token_to_id(token) if token is not None else None
