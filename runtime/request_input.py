"""The engine's input side: a prompt and its parameters checked and made into request handles before anything is
queued, so every caller's mistake is raised at once, in the caller's thread, as a typed RequestError.

    prompt (text or token ids) + SamplingParams
      --> validate(), the adapter known, logit_bias within the vocabulary, the prompt encoded
      --> SequenceLimits (runtime/limits.py): max_tokens capped to the room left, or PromptTooLong
      --> the grammar compiled (InvalidGrammar), a detokenizer and a random stream per completion
      --> RequestHandle(s), which the engine queues (Engine.submit_n / submit_embed)
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from .adapters import AdapterRegistry
from .detokenizer import IncrementalDetokenizer
from .errors import EmptyPrompt, InvalidTokenIds
from .guided import GuidedDecoding
from .limits import SequenceLimits
from .request_output import RequestHandle
from .sampler import request_generator
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer


class InputProcessor:
    def __init__(self, engine, tokenizer: Tokenizer, limits: SequenceLimits, adapters: AdapterRegistry,
                 guided: GuidedDecoding, eos_token_ids: Sequence[int], vocab_size: int, hidden_size: int,
                 seed: int | None, max_adapters_per_batch: int):
        """engine: what the handles cancel through (RequestHandle.cancel); max_adapters_per_batch: the most
        adapters one request's mix may name (a step must hold them all)."""
        self.engine, self.tokenizer, self.limits = engine, tokenizer, limits
        self.adapters, self.guided = adapters, guided
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self._entropy = np.random.SeedSequence(seed)    # streams of unseeded requests
        self._ids = itertools.count()
        self.max_adapters_per_batch = max_adapters_per_batch

    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return [int(t) for t in prompt]

    def generation(self, prompt: str | Sequence[int], params: SamplingParams | None, n: int = 1,
                   request_id: str | None = None) -> list[RequestHandle]:
        """n handles for n completions of one prompt (ids request_id, request_id-1, ...; one for req-<k> if None),
        sharing its token ids and params (max_tokens fitted). With a seed, the first draws from it and the i-th
        from (seed, i)."""
        params = (params or SamplingParams()).validate()
        if params.adapter_mix is not None:   # known adapters; a mix: no DoRA, within the per-step cap
            self.adapters.check_spec(params.adapter_mix, self.max_adapters_per_batch)
        if params.logit_bias:
            bad = [t for t in params.logit_bias if t >= self.vocab_size]
            if bad:
                raise InvalidTokenIds(f"logit_bias token ids must be in [0, {self.vocab_size}); got {bad[:5]}")
        ids = self.encode_prompt(prompt)
        max_tokens = self.limits.fit_max_tokens(len(ids), params.max_tokens)   # the one context rule
        if max_tokens != params.max_tokens:
            params = SamplingParams(**{**params.__dict__, "max_tokens": max_tokens})
        base = request_id or f"req-{next(self._ids)}"
        matcher = self.guided.compile(params.guide) if params.guide is not None else None   # InvalidGrammar: 400
        handles = []
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
            handles.append(RequestHandle(self.engine, base if i == 0 else f"{base}-{i}", ids, params, detok, gen, m))
        return handles

    def embedding(self, prompt: str | Sequence[int], pooling: str = "mean", adapter: str | None = None,
                  priority: int = 0, request_id: str | None = None) -> RequestHandle:
        """The handle of one embedding request (id emb-<k> if None): its prompt must fit whole (check_prompt)."""
        params = SamplingParams(max_tokens=1, adapter=adapter, priority=priority, pooling=pooling).validate()
        if adapter is not None:
            self.adapters.check(adapter)
        ids = self.encode_prompt(prompt)
        if not ids:
            raise EmptyPrompt("the input is empty; send at least one token")
        self.limits.check_prompt(len(ids))
        h = RequestHandle(self.engine, request_id or f"emb-{next(self._ids)}", ids, params, None, None)
        # the final hidden states it keeps: every prompt position (mean pooling) or the last one, [n, H]
        h.hidden = np.empty((len(ids) if pooling == "mean" else 1, self.hidden_size), np.float32)
        return h
