"""Figures for docs/notes/service.md: the per-token cost of a structured-output mask, the model steps a schema with long
fixed keys takes with its forced tokens verified as drafts against one step per token, and the aggregate
throughput of a 16-client HTTP load with a JSON schema on every request against the same load without.

    .venv/bin/python bench/probes/measure_structured.py ARTIFACT [--clients 16] [--requests 64] [--tokens 64]
                                                         [--rounds 0]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "story"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "story": {"type": "string", "minLength": 400, "maxLength": 400}}}


class Live:
    """An engine (room for 512 blocks) behind `ortllm serve`'s HTTP server on 127.0.0.1, in this process."""

    def __init__(self, artifact: str):
        from ortllm.runtime import Engine
        from ortllm.service.app import create_app
        from ortllm.service.config import ServiceConfig
        from ortllm.service.server import HTTPServer

        self.engine = Engine.from_artifact(artifact, num_blocks=512)
        app = create_app(ServiceConfig(http_threads=64), engine=self.engine)
        self.server = HTTPServer(app, "127.0.0.1", 0, threads=64).start()
        self.url, self.model = self.server.url, app.extensions["ortllm"].model_name

    def stop(self) -> None:
        self.server.stop()
        self.engine.close()


def mask_cost(engine, steps: int = 200) -> float:
    """Median ms to compute one mask (one row) along a real generation with the schema."""
    from ortllm.runtime.sampling_params import Guide
    m = engine.guided.compile(Guide("json_schema", SCHEMA, "bench"))
    ids = engine.tokenizer.encode('{"name":"Ada","story":"' + "once upon a time " * 40)
    times = []
    for t in ids[:steps]:
        t0 = time.perf_counter()
        engine.guided.fill_masks([m])
        times.append((time.perf_counter() - t0) * 1e3)
        if not m.consume_token(t):
            break
    return statistics.median(times)


# long fixed keys and an enum (the shape tests/runtime/test_guided.py checks forced drafts with): most of an
# answer's tokens are forced by the grammar
ORDER = {"type": "object", "additionalProperties": False,
         "required": ["customer_full_name", "customer_shipping_address", "order_priority_level"],
         "properties": {
             "customer_full_name": {"type": "string", "maxLength": 20},
             "customer_shipping_address": {
                 "type": "object", "additionalProperties": False,
                 "required": ["street_name_and_number", "postal_code_of_city"],
                 "properties": {"street_name_and_number": {"type": "string", "maxLength": 30},
                                "postal_code_of_city": {"type": "string", "maxLength": 8}}},
             "order_priority_level": {"enum": ["standard_delivery", "express_delivery"]}}}


def forced_steps(engine) -> dict:
    """One request at a time: model steps and seconds with speculative=False (one step per token) and with the
    grammar's forced tokens as drafts; the tokens must be the same."""
    from ortllm.runtime.sampling_params import Guide, SamplingParams
    tok = engine.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True))
               for t in ("Make up an order as JSON.", "An express order for Ann, JSON.", "Order 3 as JSON.")]
    out = {}
    for name, sampling in (("greedy", {"temperature": 0.0}), ("sampled", {"temperature": 0.8, "seed": 1})):
        row = {}
        for on in (False, True):
            p = SamplingParams(max_tokens=160, speculative=on, guide=Guide("json_schema", ORDER), **sampling)
            s0, t0 = engine.stats()["steps"], time.perf_counter()
            outs = [engine.generate([x], p)[0] for x in prompts]
            row["on" if on else "off"] = (outs, engine.stats()["steps"] - s0, time.perf_counter() - t0)
        (off, s_off, t_off), (on, s_on, t_on) = row["off"], row["on"]
        assert [o.token_ids for o in off] == [o.token_ids for o in on], "forced drafts changed the tokens"
        out[name] = {"tokens": sum(len(o.token_ids) for o in on), "steps_one_per_token": s_off,
                     "steps_forced_drafts": s_on, "step_ratio": round(s_on / s_off, 3),
                     "seconds_one_per_token": round(t_off, 2), "seconds_forced_drafts": round(t_on, 2)}
    return out


def load(live, clients: int, requests: int, tokens: int, schema: bool) -> float:
    import openai
    c = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=600)
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    extra = {"response_format": fmt} if schema else {}

    def one(i):
        r = c.chat.completions.create(model=live.model, max_tokens=tokens, temperature=0.8, seed=i,
                                      messages=[{"role": "user", "content": f"Tell story {i} as JSON."}],
                                      extra_body={"ignore_eos": True}, **extra)
        return r.usage.completion_tokens
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        n = sum(pool.map(one, range(requests)))
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    live = Live(a.artifact)
    try:
        print(json.dumps({"mask_ms_per_token": round(mask_cost(live.engine), 4)}))
        print(json.dumps({"forced_tokens": forced_steps(live.engine)}))
        if not a.rounds:
            return
        load(live, a.clients, a.clients, 8, False)           # warm up
        plain, guided = [], []
        for _ in range(a.rounds):                              # alternating, same run
            plain.append(load(live, a.clients, a.requests, a.tokens, False))
            guided.append(load(live, a.clients, a.requests, a.tokens, True))
        p, g = statistics.median(plain), statistics.median(guided)
        print(json.dumps({"plain_tok_s": [round(x, 1) for x in plain], "schema_tok_s": [round(x, 1) for x in guided],
                          "median_plain": round(p, 1), "median_schema": round(g, 1), "ratio": round(g / p, 3)}))
    finally:
        live.stop()


if __name__ == "__main__":
    main()
