"""The `speculative` scenario: prompt-lookup speculative decoding on vs off, alternating within one run.

Two prompt sets, greedy, chat template, each request stopping at EOS or 128 tokens:
- grounded: the answer reuses the input (rename a variable in a given function, extract fields from a passage
  into JSON, repeat a list with one change, answer from a provided paragraph, reformat given JSON);
- open: open-ended chat (poems, tips, stories).
For each repeat, set and batch size, the engine runs the set with speculation off and on (the order flips every
repeat) in the same process. Decode tok/s counts the tokens after each request's first token over the time
since then (prefill excluded; at B = 8 the set is cycled to 8 concurrent requests). Ratios on/off are taken
per repeat and reported with their min/max; acceptance = accepted / drafted tokens; tokens per step = tokens
generated per decode row that ran (1.0 without speculation).
"""
from __future__ import annotations

import time
from pathlib import Path

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

from .results import row

PASSAGE = ("The Orion Hotel in Lisbon opened on 12 March 1998. It has 212 rooms, a rooftop pool and a "
           "restaurant called Mare. The general manager is Ana Ribeiro, and the hotel is owned by Atlantic "
           "Stays Ltd.")
CODE = ("def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n"
        "        subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n"
        "    return subtotal + tax\n")
RECORD = '{"id": 17, "name": "Mina Park", "email": "mina@example.com", "city": "Busan", "plan": "pro"}'
GROUNDED = [
    f"Rename the variable subtotal to net_sum in this function and print the whole function:\n\n{CODE}",
    f"Extract the hotel's name, city, opening date, number of rooms and manager from this passage as a JSON "
    f"object:\n\n{PASSAGE}",
    "Repeat this list exactly, but replace 'pears' with 'plums': apples, pears, cherries, grapes, lemons, "
    "oranges, bananas, mangoes.",
    f"Answer from the paragraph only. Who owns the hotel and when did it open?\n\n{PASSAGE}",
    f"Rewrite this JSON record as YAML, one key per line:\n\n{RECORD}",
]
OPEN = ["Write a short poem about autumn.", "What are three tips for staying focused?",
        "Tell me a story about a dragon who learns to cook.", "Why do people enjoy music?",
        "Describe your ideal weekend."]
SETS = {"grounded": GROUNDED, "open": OPEN}
NEW_TOKENS = 128


def _chat(engine: Engine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def _run_set(engine: Engine, prompts: list[list[int]], batch: int, speculative: bool) -> tuple[float, dict]:
    """Decode tok/s of the set at this batch size, and the engine counters it moved."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, speculative=speculative)
    before = engine.stats()
    tokens, seconds = 0, 0.0
    waves = [[p] for p in prompts] if batch == 1 else [[prompts[i % len(prompts)] for i in range(batch)]]
    for wave in waves:
        handles = [engine.submit(p, params) for p in wave]
        for h in handles:
            h.result()
        end = time.monotonic()
        first = max(h.first_token_time for h in handles)
        tokens += sum(1 for h in handles for t in h.token_times if t > first)
        seconds += end - first
    after = engine.stats()
    moved = {k: after[k] - before[k] for k in ("spec_drafted", "spec_accepted", "tokens_generated", "steps")}
    return tokens / seconds if seconds > 0 else 0.0, moved


def run(artifact: Path, batches=(1, 8), repeats: int = 3, threads: int | None = None) -> list[dict]:
    overrides = {"threads": threads} if threads else {}
    overrides["spec_max_tokens"] = 8            # the default, stated: the scenario measures K = 8
    rows = []
    with Engine.from_artifact(artifact, max_num_seqs=max(batches), **overrides) as engine:
        sets = {name: [_chat(engine, t) for t in texts] for name, texts in SETS.items()}
        _run_set(engine, sets["open"][:1], 1, True)          # warm up
        for name, prompts in sets.items():
            for b in batches:
                tps = {False: [], True: []}
                counts = {"spec_drafted": 0, "spec_accepted": 0, "tokens_generated": 0, "steps": 0}
                for r in range(repeats):
                    for spec in ((False, True) if r % 2 == 0 else (True, False)):
                        rate, moved = _run_set(engine, prompts, b, spec)
                        tps[spec].append(rate)
                        if spec:
                            counts = {k: counts[k] + moved[k] for k in counts}
                label = f"{name} B={b}"
                for spec, system in ((False, "ortllm spec off"), (True, "ortllm spec on")):
                    rows.append(row("speculative", system, b, f"{name}_decode_tokens_per_s", tps[spec], "tok/s"))
                rows.append(row("speculative", "ortllm on/off", b, f"{name}_speedup",
                                [on / off if off else 0.0 for on, off in zip(tps[True], tps[False])], "x",
                                note=label))
                acc = counts["spec_accepted"] / counts["spec_drafted"] if counts["spec_drafted"] else 0.0
                rows.append(row("speculative", "ortllm spec on", b, f"{name}_acceptance_rate", [acc], "fraction"))
                # decode rows that ran = tokens generated - accepted drafts (each row adds one own token)
                rows_run = counts["tokens_generated"] - counts["spec_accepted"]
                rows.append(row("speculative", "ortllm spec on", b, f"{name}_tokens_per_row_step",
                                [counts["tokens_generated"] / rows_run if rows_run else 0.0], "tokens"))
    return rows
