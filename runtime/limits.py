"""How many tokens one sequence may hold, decided in one place.

    room = min(the model's context length, max_model_len, the KV pool)     prompt + generated tokens, at most

The scheduler builds one SequenceLimits from its config and its block pool (Scheduler.limits) and guards
add_request with it; the engine exposes the same object (Engine.limits), and every entry point asks it: the engine's
submit / submit_embed, the OpenAI / Ollama request checks (protocol/generation.py, service/embeddings.py), the batch
job through the protocol. Nothing else computes a sequence's room (tests/runtime/test_limits.py scans for it).

Three questions, one answer each:
  fit_max_tokens(prompt, max_tokens)   a generation: a prompt that leaves no room for one token is PromptTooLong;
                                       otherwise max_tokens is capped to the room left and the server's cap
                                       (SchedulerConfig.max_tokens; None: the cap, else all the room)
  check_prompt(prompt)                 an embedding: the prompt alone must fit (it generates nothing)
  admit(prompt, generated)             the scheduler's guard: prompt + generated must fit
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import SchedulerConfig
from .errors import PromptTooLong
from .sampling_params import fit_max_tokens

CONTEXT = "the model's context length"
MAX_MODEL_LEN = "max_model_len"


def configured_sequence_tokens(config: SchedulerConfig, context_length: int) -> int:
    """The sequence length the config asks for, before any KV pool exists (the memory plan sizes the pool from it,
    and reports a max_model_len past the model's context as a problem): max_model_len, else the model's context."""
    return config.max_model_len or context_length


@dataclass(frozen=True)
class SequenceLimits:
    kv_pool_blocks: int                 # usable KV blocks (the null block excluded)
    block_size: int                     # tokens per KV block
    max_model_len: int | None = None    # SchedulerConfig.max_model_len; None: no cap of its own
    context_length: int | None = None   # the model's positions (generation.json); None: a scheduler without a model
    max_tokens: int | None = None       # SchedulerConfig.max_tokens: a request's default and cap of max_tokens

    @classmethod
    def of(cls, config: SchedulerConfig, kv_pool_blocks: int, block_size: int,
           context_length: int | None = None) -> "SequenceLimits":
        return cls(kv_pool_blocks, block_size, config.max_model_len, context_length, config.max_tokens)

    @property
    def kv_pool_tokens(self) -> int:
        """The most tokens one sequence's KV may take: the whole pool."""
        return self.kv_pool_blocks * self.block_size

    def _bounds(self) -> list[tuple[int, str]]:
        """(limit, its name) of every limit that is set, the model's own first (it wins a tie)."""
        pool = f"the KV pool: {self.kv_pool_blocks} blocks x {self.block_size} tokens; raise num_blocks"
        out = [(self.context_length, CONTEXT), (self.max_model_len, MAX_MODEL_LEN), (self.kv_pool_tokens, pool)]
        return [(n, what) for n, what in out if n is not None]

    @property
    def room(self) -> int:
        """The most tokens (prompt + generated) one sequence may hold."""
        return min(n for n, _ in self._bounds())

    @property
    def what(self) -> str:
        """The name of the limit that sets room (error messages: "at most N fit (what)")."""
        return next(what for n, what in self._bounds() if n == self.room)

    def fit_max_tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        """A generation's max_tokens within the room (runtime.sampling_params.fit_max_tokens, the one rule)."""
        return fit_max_tokens(prompt_len, max_tokens, self.room, self.what, self.max_tokens)

    def check_prompt(self, prompt_len: int) -> None:
        """An embedding request: its prompt alone must fit (no generated token needs room)."""
        self.admit(prompt_len, 0)

    def admit(self, prompt_len: int, generated: int) -> None:
        """PromptTooLong unless prompt_len + generated tokens fit."""
        if prompt_len + generated > self.room:
            raise PromptTooLong(prompt_len, self.room, generated, self.what)
