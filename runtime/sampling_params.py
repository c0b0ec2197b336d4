"""Per-request generation parameters (OpenAI / vLLM semantics)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Union

from .errors import InvalidSamplingParams, PromptTooLong

# Temperatures below this are greedy.
SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20
LOGIT_BIAS_RANGE = (-100.0, 100.0)
PENALTY_RANGE = (-2.0, 2.0)                  # frequency_penalty, presence_penalty
REPETITION_PENALTY_RANGE = (0.01, 100.0)     # bounded: a penalty near 0 divides logits into inf, softmax into NaN
GUIDE_KINDS = ("json_schema", "json_object", "regex", "choice", "lark")
POOLINGS = ("mean", "last")                  # an embedding request's pooling of its final hidden states
MAX_MIX = 4                                  # adapters one request may mix (contract.MAX_ADAPTER_TERMS)

# What a request runs with, canonical: None (the base model), an adapter's name (one adapter of weight 1: `adapter`,
# or `adapters` with one name at 1.0, bit for bit the same), or a mix, ((name, weight), ...) sorted by name. The order
# is the one the ops add the terms in: fixed per request, never by slot or batch, so a mixed row is batch-invariant.
AdapterSpec = Union[str, tuple[tuple[str, float], ...], None]


@dataclass(frozen=True)
class Guide:
    """A structured-output constraint, compiled into per-step token masks (runtime/guided.py).

    kind: json_schema (spec: the schema, a dict) | json_object (any JSON object; spec None) | regex (a str) |
    choice (a list of str) | lark (an llguidance Lark grammar, str). param: the request field it came from,
    named in the error if it does not compile."""
    kind: str
    spec: object = None
    param: str | None = None


@dataclass
class SamplingParams:
    max_tokens: int | None = 128        # None: the engine's default (SchedulerConfig.max_tokens, else the room left)
    temperature: float = 1.0            # 0: greedy
    top_k: int = 0                      # 0: off
    top_p: float = 1.0                  # 1: off
    min_p: float = 0.0                  # 0: off; drop tokens with p < min_p * p_max
    repetition_penalty: float = 1.0     # 1: off; tokens seen in prompt or output: logit>0 -> /r, else *r
    frequency_penalty: float = 0.0      # logit -= f * count in output
    presence_penalty: float = 0.0       # logit -= p * (count in output > 0)
    seed: int | None = None             # same seed -> same tokens whatever else is in the batch
    stop: list[str] = field(default_factory=list)          # stop strings, excluded from the text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None         # None: none; n: chosen token's logprob plus the top n
    adapter: str | None = None          # LoRA adapter name; None: base model
    adapters: dict[str, float] | None = None   # a mix: up to 4 adapter names -> weights (finite; the delta is
                                        # sum_i w_i * scale_i * B_i A_i); instead of `adapter`
    priority: int = 0                   # higher is scheduled first
    deadline_s: float | None = None     # still queued (no token out) this long after submission: "deadline"
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit before sampling (OpenAI)
    guide: Guide | None = None          # structured output: only tokens the grammar allows are sampled
    prompt_logprobs: bool = False       # logprob of every prompt token after the first (echo; no prefix cache)
    speculative: bool = True            # drafts: prompt lookup when the engine has it on, a guide's forced tokens
                                        # (the same tokens either way; False: one step per token)
    pooling: str | None = None          # an embedding request: prefill only, then its final hidden states pooled
                                        # ("mean" over its tokens, or its "last" token's); None: generate

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def adapter_mix(self) -> AdapterSpec:
        """The canonical AdapterSpec of adapter / adapters (validate() first)."""
        if not self.adapters:
            return self.adapter
        if len(self.adapters) == 1:
            (name, w), = self.adapters.items()
            if float(w) == 1.0:
                return name
        return tuple(sorted((name, float(w)) for name, w in self.adapters.items()))

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return adapter_names(self.adapter_mix)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def raw_argmax(self) -> bool:
        """The token is the argmax of the raw logits row: greedy with nothing that changes the logits (but a
        guide's mask) or asks for more than the token."""
        return self.greedy and not self.logit_bias and self.logprobs is None and not has_penalty(self)

    def stop_ids(self, eos_token_ids: Iterable[int]) -> frozenset[int]:
        """The token ids that finish this request with "stop": the model's EOS ids unless ignore_eos, and
        stop_token_ids. The one rule for the scheduler's per-token check, the engine's early end of multi-step
        runs and the detokenizer."""
        return frozenset(self.stop_token_ids).union(() if self.ignore_eos else eos_token_ids)

    def validate(self) -> SamplingParams:
        """Raise InvalidSamplingParams naming the field (its `param`) and the allowed range; return self."""
        if self.max_tokens is not None:
            _int("max_tokens", self.max_tokens, lo=1)
        _float("temperature", self.temperature, ">= 0", lambda v: v >= 0)
        _int("top_k", self.top_k, lo=0, note=" (0 = off)")
        _float("top_p", self.top_p, "in (0, 1]", lambda v: 0 < v <= 1)
        _float("min_p", self.min_p, "in [0, 1]", lambda v: 0 <= v <= 1)
        (rlo, rhi), (plo, phi) = REPETITION_PENALTY_RANGE, PENALTY_RANGE
        _float("repetition_penalty", self.repetition_penalty, f"in [{rlo:g}, {rhi:g}] (1 = off)",
               lambda v: rlo <= v <= rhi)
        _float("frequency_penalty", self.frequency_penalty, f"in [{plo:g}, {phi:g}]", lambda v: plo <= v <= phi)
        _float("presence_penalty", self.presence_penalty, f"in [{plo:g}, {phi:g}]", lambda v: plo <= v <= phi)
        if self.seed is not None:
            _int("seed", self.seed, lo=0, hi=2**64 - 1)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidSamplingParams(f"stop must be a list of non-empty strings; got {s!r}", "stop")
        for t in self.stop_token_ids:
            _int("stop_token_ids[]", t, lo=0)
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParams(f"ignore_eos must be true or false; got {self.ignore_eos!r}", "ignore_eos")
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, lo=0, hi=MAX_LOGPROBS)
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter):
            raise InvalidSamplingParams(f"adapter must be a non-empty name or null; got {self.adapter!r}", "adapter")
        if self.adapters is not None:
            _mix("adapters", self.adapters)
            if self.adapter is not None and self.adapters:
                raise InvalidSamplingParams(
                    f"give adapter (one name) or adapters (names -> weights), not both; got adapter={self.adapter!r} "
                    f"and adapters={self.adapters!r}: to mix, name the base model in model and every adapter, with "
                    "its weight, in adapters", "adapters")
        _int("priority", self.priority)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise InvalidSamplingParams(f"logit_bias must map token ids to numbers; got {self.logit_bias!r}",
                                            "logit_bias")
            lo, hi = LOGIT_BIAS_RANGE
            for t, b in self.logit_bias.items():
                _int("logit_bias token id", t, lo=0)
                _float(f"logit_bias[{t}]", b, f"in [{lo:g}, {hi:g}]", lambda v: lo <= v <= hi)
        if self.guide is not None and (not isinstance(self.guide, Guide) or self.guide.kind not in GUIDE_KINDS):
            raise InvalidSamplingParams(f"guide must be a Guide of kind {', '.join(GUIDE_KINDS)}; got {self.guide!r}",
                                        "guide")
        if not isinstance(self.prompt_logprobs, bool):
            raise InvalidSamplingParams(f"prompt_logprobs must be true or false; got {self.prompt_logprobs!r}",
                                        "prompt_logprobs")
        if not isinstance(self.speculative, bool):
            raise InvalidSamplingParams(f"speculative must be true or false; got {self.speculative!r}", "speculative")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise InvalidSamplingParams(f"pooling must be one of {', '.join(POOLINGS)}; got {self.pooling!r}",
                                        "pooling")
        if self.deadline_s is not None:
            _float("deadline_s", self.deadline_s, "> 0 (seconds) or null", lambda v: v > 0)
        return self


def adapter_names(spec: AdapterSpec) -> tuple[str, ...]:
    """The adapters an AdapterSpec uses (what the scheduler counts and the engine loads)."""
    if spec is None:
        return ()
    return (spec,) if isinstance(spec, str) else tuple(name for name, _ in spec)


def adapter_cache_key(spec: AdapterSpec, content_key: Callable[[str], str]) -> str | None:
    """The prefix cache's key for the KV an AdapterSpec computes: an adapter's content key (its sha256), or for a mix
    each adapter's content key with its weight (exact, float.hex), in the spec's order: KV is shared only by requests
    with the same weights of the same adapter files."""
    if spec is None:
        return None
    if isinstance(spec, str):
        return content_key(spec)
    return "mix:" + ",".join(f"{content_key(name)}*{w.hex()}" for name, w in spec)


def _mix(name: str, v: object) -> None:
    if not isinstance(v, dict):
        raise InvalidSamplingParams(f"{name} must map adapter names to weights, e.g. {{\"a\": 0.7, \"b\": 0.3}}; "
                                    f"got {v!r}", name)
    if len(v) > MAX_MIX:
        raise InvalidSamplingParams(f"{name} mixes at most {MAX_MIX} adapters; got {len(v)} ({', '.join(map(str, v))})",
                                    name)
    for key, w in v.items():
        if not isinstance(key, str) or not key:
            raise InvalidSamplingParams(f"{name} keys must be non-empty adapter names; got {key!r}", name)
        _float(f"{name}[{key!r}]", w, "a finite number (the adapter's weight)", lambda _: True)


def has_penalty(p: SamplingParams) -> bool:
    """The row needs its token history (repetition, frequency or presence penalty)."""
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def fit_max_tokens(prompt_len: int, max_tokens: int | None, room: int,
                   what: str = "the model's context length", cap: int | None = None) -> int:
    """The one rule for a prompt and max_tokens past the context, at every entry point (what vLLM's and
    llama.cpp's servers do): a prompt that leaves no room for one new token is refused (PromptTooLong; HTTP 400
    context_length_exceeded); otherwise max_tokens is capped to the room left (None: all of it), and a
    generation that reaches the end of the context finishes with finish_reason "length".

    room: the most tokens a sequence may hold (the context length, or less: max_model_len, the KV pool).
    cap: the server's default and cap of max_tokens (SchedulerConfig.max_tokens): None takes it, a larger one is
    clamped to it (llama-server's --n-predict)."""
    if prompt_len >= room:
        raise PromptTooLong(prompt_len, room - 1, what=what)
    left = room - prompt_len if cap is None else min(room - prompt_len, cap)
    return left if max_tokens is None else min(max_tokens, left)


def _int(name: str, v: object, lo: int | None = None, hi: int | None = None, note: str = "") -> None:
    ok = isinstance(v, int) and not isinstance(v, bool)
    ok = ok and (lo is None or v >= lo) and (hi is None or v <= hi)
    if not ok:
        rng = (f" in [{lo}, {hi}]" if hi is not None else f" >= {lo}") if lo is not None else ""
        raise InvalidSamplingParams(f"{name} must be an integer{rng}{note}; got {v!r}", field_of(name))


def _float(name: str, v: object, allowed: str, ok) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
        raise InvalidSamplingParams(f"{name} must be {allowed}; got {v!r}", field_of(name))


def field_of(name: str) -> str:
    """The request field a checked name belongs to: "logit_bias[5]", "logit_bias token id" -> "logit_bias"."""
    return re.match(r"\w+", name).group(0)
