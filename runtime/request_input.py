"""The engine's input side, the one place that decides whether a request is valid: a prompt and its parameters
checked and made into request states (and their handles) before anything is queued, so every caller's mistake is
raised at once, in the caller's thread, as a typed RequestError whose `param` names the field. Every API (OpenAI,
Ollama, Messages, Responses, batch: protocol/) only parses its wire format and submits here; the scheduler checks
only what it alone knows (a full queue, the KV pool; runtime/scheduler.py).

    prompt (text or token ids) + SamplingParams
      --> validate() (ranges), the adapter or mix known (no DoRA in a mix, at most a step's adapters),
          logit_bias within the vocabulary
      --> the prompt: text within max_prompt_chars, then encoded; token ids integers within the vocabulary; not empty
      --> SequenceLimits (runtime/limits.py): max_tokens capped to the room left and the server's cap (None: the
          server's default), or PromptTooLong
      --> the grammar compiled (InvalidGrammar), a detokenizer and a random stream per completion
      --> RequestState(s) (runtime/output_processor.py), each with its RequestHandle, which the engine queues
          (Engine.submit_n / submit_embed)
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from .adapters import AdapterRegistry
from .detokenizer import IncrementalDetokenizer
from .errors import EmptyPrompt, InvalidTokenIds, PromptTooManyChars
from .guided import GuidedDecoding
from .limits import SequenceLimits
from .output_processor import RequestState
from .sampler import request_generator
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer


class InputProcessor:
    def __init__(self, engine, tokenizer: Tokenizer, limits: SequenceLimits, adapters: AdapterRegistry,
                 guided: GuidedDecoding, eos_token_ids: Sequence[int], vocab_size: int, hidden_size: int,
                 seed: int | None, max_adapters_per_batch: int):
        """engine: what the handles cancel through (its cancel(request_id)); max_adapters_per_batch: the most
        adapters one request's mix may name (a step must hold them all)."""
        self.engine, self.tokenizer, self.limits = engine, tokenizer, limits
        self.adapters, self.guided = adapters, guided
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self._entropy = np.random.SeedSequence(seed)    # streams of unseeded requests
        self._ids = itertools.count()
        self.max_adapters_per_batch = max_adapters_per_batch
        self._max_chars: int | None = None

    @property
    def max_prompt_chars(self) -> int:
        """More characters than any prompt that fits the context can have: the room x the longest vocabulary entry
        (x 2 for safety). A raw BPE entry is at least as long as the text it decodes to (byte-level: a char per
        byte; sentencepiece: "\u2581" per space; byte fallback "<0xE2>" longer still), so a prompt past this is
        refused without tokenizing it: a 1 MB prompt costs seconds of tokenizer CPU otherwise."""
        if self._max_chars is None:
            tok = self.tokenizer
            longest = max((len(tok.id_to_token(i) or "") for i in range(tok.vocab_size)), default=1)
            self._max_chars = 2 * self.limits.room * max(longest, 1) + 1024
        return self._max_chars

    def encode_prompt(self, prompt: str | Sequence[int], param: str = "prompt", special_tokens: bool = True,
                      whole: bool = True) -> list[int]:
        """A prompt's token ids, checked: text within max_prompt_chars (unless not whole: an input the caller
        truncates), encoded with BOS/EOS as the model adds them (special_tokens=False: a chat template's text,
        which has them); token ids integers in [0, vocab_size). param: the request field it came from."""
        if isinstance(prompt, str):
            if whole and len(prompt) > self.max_prompt_chars:
                raise PromptTooManyChars(len(prompt), self.max_prompt_chars, self.limits.room, param)
            return self.tokenizer.encode(prompt, add_special_tokens=special_tokens)
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise InvalidTokenIds(f"{param} token ids must be integers", param) from None
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidTokenIds(f"{param} token ids must be in [0, {self.vocab_size}); got {bad[:5]}", param)
        return ids

    def check_params(self, params: SamplingParams | None) -> SamplingParams:
        """The checks of a request's parameters that need the engine: validate() (ranges), the adapter or mix
        known and runnable, logit_bias within the vocabulary."""
        params = (params or SamplingParams()).validate()
        if params.adapter_mix is not None:   # known adapters; a mix: no DoRA, within the per-step cap
            self.adapters.check_spec(params.adapter_mix, self.max_adapters_per_batch,
                                     "adapters" if params.adapters else "adapter")
        if params.logit_bias:
            bad = [t for t in params.logit_bias if t >= self.vocab_size]
            if bad:
                raise InvalidTokenIds(f"logit_bias names token ids outside the vocabulary [0, {self.vocab_size}): "
                                      f"{bad[:5]}", "logit_bias")
        return params

    def generation(self, prompt: str | Sequence[int], params: SamplingParams | None, n: int = 1,
                   request_id: str | None = None) -> list[RequestState]:
        """n states for n completions of one prompt (ids request_id, request_id-1, ...; one for req-<k> if None),
        sharing its token ids and params (max_tokens fitted). With a seed, the first draws from it and the i-th
        from (seed, i)."""
        params = self.check_params(params)
        ids = self.encode_prompt(prompt)
        if not ids:
            raise EmptyPrompt()
        max_tokens = self.limits.fit_max_tokens(len(ids), params.max_tokens)   # the one context rule
        if max_tokens != params.max_tokens:
            params = SamplingParams(**{**params.__dict__, "max_tokens": max_tokens})
        base = request_id or f"req-{next(self._ids)}"
        matcher = self.guided.compile(params.guide) if params.guide is not None else None   # InvalidGrammar: 400
        states = []
        for i in range(n):
            detok = IncrementalDetokenizer(lambda t: self.tokenizer.decode(t, skip_special_tokens=True), ids,
                                           stop=params.stop, stop_token_ids=params.stop_ids(self.eos_token_ids),
                                           stream=self.tokenizer.decode_stream)
            if params.greedy:
                gen = None
            elif i and params.seed is not None:
                gen = np.random.Generator(np.random.Philox(np.random.SeedSequence([params.seed, i])))
            else:
                gen = request_generator(params.seed, self._entropy)
            m = None if matcher is None else (matcher if i == 0 else matcher.deep_copy())
            states.append(RequestState(base if i == 0 else f"{base}-{i}", ids, params, detok, gen, m,
                                       cancel=self.engine.cancel))
        return states

    def embedding(self, prompt: str | Sequence[int], pooling: str = "mean", adapter: str | None = None,
                  priority: int = 0, request_id: str | None = None) -> RequestState:
        """The state of one embedding request (id emb-<k> if None): its prompt must fit whole (check_prompt)."""
        params = self.check_params(SamplingParams(max_tokens=1, adapter=adapter, priority=priority, pooling=pooling))
        ids = self.encode_prompt(prompt)
        if not ids:
            raise EmptyPrompt("the input is empty; send at least one token")
        self.limits.check_prompt(len(ids))
        # the final hidden states it keeps: every prompt position (mean pooling) or the last one, [n, H]
        hidden = np.empty((len(ids) if pooling == "mean" else 1, self.hidden_size), np.float32)
        return RequestState(request_id or f"emb-{next(self._ids)}", ids, params, None, None, hidden=hidden,
                            cancel=self.engine.cancel)
