"""Flags come from the config (cli/options.py): every flag's `--help` default is the default the code applies,
for build, serve, generate and run; enumerated flags have choices; booleans take --x / --no-x; every existing flag
spelling still parses."""
from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from ortllm.cli import make_parser
from ortllm.cli.build_options import BUILD_OPTIONS, build_options
from ortllm.cli.options import Bool, fill_defaults, format_value
from ortllm.cli.serve import OPTIONS as SERVE_OPTIONS, service_config, settings


def _sub(verb: str) -> argparse.ArgumentParser:
    parser = make_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[verb]


def _help_defaults(verb: str) -> dict[str, str]:
    """{dest: the text after `(default: ` in its --help}, for every option that states one."""
    out = {}
    for action in _sub(verb)._actions:
        m = re.search(r"\(default: (.*)\)$", action.help or "", re.S)
        if m and action.option_strings:
            out[action.dest] = m.group(1).replace("%%", "%")
    return out


def _parse(*argv: str) -> argparse.Namespace:
    return make_parser().parse_args(list(argv))


def test_build_help_defaults_are_the_builds(tmp_path):
    from ortllm.pipeline.build import DEFAULT_KV, DEFAULT_LM_HEAD, BuildOptions
    from ortllm.pipeline.recipes import known_recipes

    stated = _help_defaults("build")
    gguf = str(tmp_path / "model.gguf")          # not a recipe: the dataclass's defaults
    opts = build_options(_parse("build", gguf, "--out", str(tmp_path / "o")))
    derived = {"quant", "block_size", "smooth", "act16", "lm_head", "lm_head_algo", "kv"}
    for opt in BUILD_OPTIONS:
        if opt.key in derived or opt.owner is None:
            continue
        assert stated[opt.key] == format_value(getattr(opts, opt.key)), opt.flag
    assert set(stated) >= {o.key for o in BUILD_OPTIONS if o.owner is not None}

    assert stated["quant"] == f"the recipe's, else {opts.quant}" and opts.quant == BuildOptions().quant
    assert stated["block_size"] == f"the recipe's, else {opts.block_size}"
    recipe = next(n for n, r in known_recipes().items() if "quant" in r.build)
    from_recipe = build_options(_parse("build", recipe, "--out", str(tmp_path / "o")))
    assert from_recipe.quant == known_recipes()[recipe].build["quant"]
    for quant in ("fp32", "int8", "int4"):       # the per-quant defaults the help states are the build's
        o = build_options(_parse("build", gguf, "--out", "o", "--quant", quant))
        assert f"{o.lm_head} for --quant" in stated["lm_head"] and o.lm_head == DEFAULT_LM_HEAD[quant]
        assert re.search(rf"{o.kv} for --quant [a-z0-9|]*{quant}", stated["kv"]) and o.kv == DEFAULT_KV[quant]
        assert o.smooth_alpha == (0.5 if quant == "int8" else 0.0)
    assert "0.5 for --quant int8" in stated["smooth"]
    portable = build_options(_parse("build", gguf, "--out", "o", "--quant", "int4", "--graph", "portable"))
    assert portable.kv == "fp32" and "fp32 on the portable one" in stated["kv"]
    from ortllm.pipeline.quantize import DEFAULT_HEAD_ALGO
    assert stated["lm_head_algo"].startswith(DEFAULT_HEAD_ALGO)


def test_serve_help_defaults_are_the_servers(tiny_engine):
    from ortllm.runtime.config import DEFAULT_KV_BUDGET_BYTES, EngineConfig, physical_cores
    from ortllm.runtime.engine import engine_config
    from ortllm.service.config import RayOptions
    from ortllm.service.resources import default_memory_budget

    stated = _help_defaults("serve")
    a = _parse("serve", str(tiny_engine))
    values = settings(a, env={})
    assert all(source == "default" for k, (_, source) in values.items() if k != "artifact")
    config = service_config(a, values, ((None, tiny_engine),))
    engine = engine_config(tiny_engine, **config.engine_overrides)
    ray = RayOptions()
    applied = {"max_queued": engine.scheduler.max_queued, "parallel": engine.scheduler.max_num_seqs,
               "max_batch_tokens": engine.scheduler.max_batch_tokens,
               "spec_max_tokens": engine.scheduler.spec_max_tokens, "decode_steps": engine.scheduler.decode_steps,
               "host": config.host, "port": config.port, "request_timeout": config.request_timeout_s,
               "drain_timeout": config.drain_timeout_s, "keep_alive": config.keep_alive_s, "ray": a.ray,
               "replicas": ray.replicas, "threads_per_replica": ray.threads_per_replica}
    for key, value in applied.items():
        assert stated[key] == format_value(value), key
    # the defaults the code derives, as the help says them
    assert stated["ctx_size"] == "the model's context length"
    assert engine.scheduler.max_model_len == engine_config(tiny_engine).scheduler.max_model_len == 512
    assert stated["threads"] == "physical cores" and engine.threads == physical_cores() == EngineConfig("x").threads
    assert stated["http_threads"] == "--parallel + --max-queued + 8, at least 64"
    assert config.http_threads == max(64, engine.scheduler.max_num_seqs + engine.scheduler.max_queued + 8)
    assert stated["kv_cache_size"] == f"{DEFAULT_KV_BUDGET_BYTES / 2**30:g} GiB"
    assert engine.cache.memory_budget_bytes is None and engine.cache.num_blocks is None   # -> that budget
    assert stated["memory_budget"] == "80% of RAM" and config.memory_budget_bytes is None
    import os
    assert default_memory_budget() == int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    assert stated["model_name"] == "the artifact's recipe" and stated["address"] == "a local Ray instance"
    assert set(stated) >= {o.key for o in SERVE_OPTIONS if o.owner is not None and o.key not in (
        "api_key", "min_replicas", "max_replicas")}


def test_generate_and_run_help_defaults_are_what_they_apply():
    import inspect

    from ortllm.cli.generate import GENERATE_OPTIONS, generate_text
    from ortllm.cli.run import RUN_OPTIONS, ChatOptions

    stated = _help_defaults("generate")
    a = _parse("generate", "art", "--prompt", "hi")
    fill_defaults(a, GENERATE_OPTIONS)
    sig = inspect.signature(generate_text).parameters
    for key in ("max_tokens", "temperature", "chat"):
        assert stated[key] == format_value(getattr(a, key)) == format_value(sig[key].default), key
    assert stated["threads"] == "physical cores" and a.threads is None       # generate_text: None -> the engine's

    stated = _help_defaults("run")
    a = _parse("run", "art")
    fill_defaults(a, RUN_OPTIONS)
    for f in dataclasses.fields(ChatOptions):
        assert getattr(a, f.name) == f.default
        if f.default is not None:
            assert stated[f.name] == format_value(f.default), f.name


def test_choices_one_boolean_style_and_old_spellings():
    build = _sub("build")
    for dest in ("quant", "algo", "lm_head", "lm_head_algo", "kv", "graph", "exporter", "kv_block_size"):
        action = next(a for a in build._actions if a.dest == dest)
        assert action.choices, dest
    bools = [a for verb in ("build", "serve", "generate", "run", "eval", "batch") for a in _sub(verb)._actions
             if isinstance(a, Bool)]
    assert all(any(s.startswith("--no-") for s in a.option_strings) for a in bools)
    with pytest.raises(SystemExit):
        _parse("build", "r", "--out", "o", "--quant", "int3")
    old = _parse("build", "r", "--out", "o", "--quant", "int8", "--kv", "int8", "--kv-rotate", "0", "--source-mix", "0",
                 "--symmetric", "--force", "--keep", "a=int8", "--keep", "b=fp32")
    o = build_options(old)
    assert (o.kv_rotate, o.source_mix, o.symmetric, o.keep) == (False, False, True, ("a=int8", "b=fp32"))
    new = build_options(_parse("build", "r", "--out", "o", "--kv", "int8", "--no-kv-rotate", "--no-source-mix"))
    assert (new.kv_rotate, new.source_mix) == (False, False)
    assert _parse("eval", "x", "--reference", "r", "--out", "o", "--no-pass-at-1").pass_at_1 is False
    assert _parse("batch", "x", "--input", "i", "--output", "o", "--no-progress").progress is False
    serve = _parse("serve", "x", "--api-key", "k", "--max-queued", "3", "--threads", "1", "--decode-steps", "2",
                   "--spec-max-tokens", "0", "--http-threads", "4", "--memory-budget", "2", "--keep-alive", "5",
                   "--request-timeout", "9", "--drain-timeout", "1", "--model-name", "m", "--ray", "--replicas", "3",
                   "--threads-per-replica", "2", "--address", "auto", "--host", "127.0.0.1", "--port", "0")
    assert (serve.max_queued, serve.ray, serve.memory_budget) == (3, True, 2.0)
    gen = _parse("generate", "x", "--prompt", "p", "--chat", "--system", "s", "--adapter", "a", "--max-tokens", "3",
                 "--temperature", "0.5", "--seed", "1", "--threads", "2")
    assert (gen.chat, gen.max_tokens, gen.seed) == (True, 3, 1)
