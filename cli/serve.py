"""`ortllm serve`: its options (each from the config field it sets: cli/options.py), their sources and the run.

Every option comes from, highest first: the command line, an `ORTLLM_<NAME>` env var (ORTLLM_CTX_SIZE=2048), the
TOML file of `--config FILE` (ctx_size = 2048), the default. `--print-config` shows each value and its source. A
config file may size each model of a multi-model server on its own:

    artifact = ["smollm2-135m-instruct:int4", "tinyllama:int4"]
    parallel = 8
    [models."tinyllama:int4"]              # its served name, its path as given, or its directory's name
    ctx_size = 1024
    kv_cache_size = "auto"

The API key never needs the command line (where `ps` shows it): ORTLLM_API_KEY, `api_key` in the file, or
--api-key-file FILE.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ortllm.runtime.config import DEFAULT_KV_BUDGET_BYTES, CacheConfig
from ortllm.runtime.errors import ConfigError

from .options import Bool, Option, add_options, env_name, flag_names, format_value, layer, read_toml

GIB = 1 << 30


def _service():
    from ortllm.service.config import ServiceConfig
    return ServiceConfig


def _scheduler():
    from ortllm.runtime.config import SchedulerConfig
    return SchedulerConfig


def _engine():
    from ortllm.runtime.config import EngineConfig
    return EngineConfig


def _adapters():
    from ortllm.runtime.config import AdapterConfig
    return AdapterConfig


def _ray():
    from ortllm.service.config import RayOptions
    return RayOptions


def gib_or_auto(text: str) -> float | str:
    """--kv-cache-size: GiB (a number > 0) or auto."""
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"expected GiB (e.g. 2.5) or auto; got {text!r}") from None
    if not v > 0:
        raise ValueError(f"expected GiB > 0 or auto; got {text!r}")
    return v


def gib(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise ValueError(f"expected GiB > 0; got {text!r}")
    return v


def size(text: str) -> int:
    """--max-request-size, --max-upload-size: '1048576', '512K', '1M', '4G' (binary units) -> bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    num, unit = str(text).strip().upper().removesuffix("IB").removesuffix("B"), ""
    if num and num[-1] in units:
        num, unit = num[:-1], num[-1]
    try:
        return int(float(num) * units[unit])
    except ValueError:
        raise ValueError(f"a size is a number of bytes with K, M or G; got {text!r}") from None


def _kv_default() -> str:
    return f"{DEFAULT_KV_BUDGET_BYTES / GIB:g} GiB"


def _bytes(v):
    return v if v == "auto" else int(v * GIB)


# Engine options: EngineConfig keys, per model in a file's [models."NAME"] tables too. Sizing first.
SIZING = (
    Option("--ctx-size", "tokens one sequence may hold (prompt + generated), up to the model's context length",
           _scheduler, "max_model_len", default_text="the model's context length", metavar="TOKENS"),
    Option("--max-tokens", "a request's max_tokens when it sends none, and the most it may ask for (a larger one is "
           "clamped to it: finish_reason length)", _scheduler, "max_tokens",
           default_text="none: the room the context leaves", metavar="N"),
    Option("--parallel", "sequences generated at once; more requests wait in the queue (--max-queued)",
           _scheduler, "max_num_seqs", metavar="N"),
    Option("--kv-cache-size", f"KV cache in GiB, or auto: {CacheConfig().auto_share:.0%} of the memory free after "
           "weights, adapters and headroom, at most --parallel sequences of --ctx-size", None, dest="kv_cache_size",
           type=gib_or_auto, metavar="GIB|auto", default_text=_kv_default),
    Option("--max-batch-tokens", "tokens in one engine step (decodes + prefill chunks)", _scheduler,
           metavar="N"),
    # the adapter slot stacks are reserved at start (num_layers x slots x rank): 2.7 GiB at 8B with the defaults
    Option("--max-loras", "LoRA adapters resident at once, and the most one step mixes; their slots are reserved at "
           "start (the plan's `adapters` line): lower it for a large model without many adapters", _adapters,
           "max_slots", metavar="N"),
    Option("--max-lora-rank", "largest LoRA rank an adapter may have (each slot is reserved at this rank)",
           _adapters, "max_rank", metavar="R"),
)
ENGINE = SIZING + (
    Option("--max-queued", "requests waiting for a running slot before 429", _scheduler, metavar="N"),
    Option("--threads", "engine intra-op threads", _engine, default_text="physical cores", metavar="N"),
    Option("--spec-max-tokens", "prompt-lookup speculative decoding: up to K drafted tokens per decode row in steps "
           "of at most 2 decode rows (0: off)", _scheduler, metavar="K"),
    Option("--decode-steps", "multi-step decoding: greedy decode batches run up to K model steps per schedule, text "
           "streaming K tokens at a time (1: off)", _scheduler, metavar="K"),
)
# the engine key each option sets (kv_cache_size: CacheConfig.memory_budget_bytes, in bytes or "auto")
ENGINE_KEYS = {o.key: (o.field or o.key) for o in ENGINE} | {"kv_cache_size": "memory_budget_bytes"}

SERVICE = (
    Option("--host", "address to listen on", _service),
    Option("--port", "0: any free port (printed when ready)", _service),
    Option("--api-key", "require `Authorization: Bearer KEY` on the API; prefer ORTLLM_API_KEY or --api-key-file "
           "(the command line shows in ps)", _service, metavar="KEY"),
    Option("--api-key-file", "read the API key from this file (its first line)", None, type=Path, metavar="FILE"),
    Option("--allowed-path", "a directory whose files requests may name (pull, /v1/adapters); repeatable", _service,
           "allowed_paths", type=Path, metavar="DIR", repeat=True, default_text="the store, $ORTLLM_HOME"),
    Option("--cors-origin", "a page origin (http://localhost:3000, or *) allowed to call the API; repeatable",
           _service, "cors_origins", type=str, metavar="ORIGIN", repeat=True, default_text="none: CORS off"),
    Option("--max-request-size", "largest request body, e.g. 1M; larger get 413", _service, "max_body_bytes",
           type=size, metavar="SIZE", default_text="1M"),
    Option("--max-upload-size", "largest file sent to POST /api/blobs, e.g. 512M; larger get 413", _service,
           "max_upload_bytes", type=size, metavar="SIZE", default_text="1G"),
    Option("--http-threads", "concurrent HTTP requests (streams included)", _service,
           default_text="--parallel + --max-queued + 8, at least 64", metavar="N"),
    Option("--model-name", "the `model` clients send", _service, default_text="the artifact's recipe"),
    Option("--request-timeout", "seconds before a generation is cancelled", _service, "request_timeout_s",
           metavar="SECONDS"),
    Option("--drain-timeout", "seconds in-flight requests get on SIGTERM", _service, "drain_timeout_s",
           metavar="SECONDS"),
    Option("--keep-alive", "with several models: unload one after this long without requests", _service,
           "keep_alive_s", metavar="SECONDS"),
    Option("--memory-budget", "with several models: GiB their weights and KV pools may take; least recently used "
           "idle models are unloaded to make room", None, type=gib, metavar="GIB", default_text="80% of RAM"),
)
RAY = (
    Option("--ray", "run engine replicas as a Ray Serve application, routed by adapter residency and prompt prefix",
           None, default=False),
    Option("--address", "cluster to join (e.g. auto, or ray://HEAD:10001)", _ray,
           default_text="a local Ray instance"),
    Option("--replicas", "engine replicas", _ray, metavar="N"),
    Option("--min-replicas", "autoscale between --min-replicas and --max-replicas instead of a fixed --replicas",
           _ray, metavar="N"),
    Option("--max-replicas", "", _ray, metavar="N"),
    Option("--threads-per-replica", "each replica's engine threads = the CPUs Ray reserves for it", _ray,
           metavar="N"),
)
ARTIFACT = Option("artifact", "", None, dest="artifact", type=Path, repeat=True)   # layered like the rest
OPTIONS = ENGINE + SERVICE + RAY + (ARTIFACT,)


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve engine artifacts (directories or store names) over an OpenAI-compatible "
                                     "HTTP API", epilog="Every option can also come from an ORTLLM_<NAME> env var "
                       "(ORTLLM_CTX_SIZE=2048, ORTLLM_API_KEY=...) or a --config TOML file (ctx_size = 2048; "
                       "[models.\"NAME\"] tables size one model); a flag wins over the env, the env over the file.")
    p.add_argument("artifact", type=Path, nargs="*", metavar="ARTIFACT", default=argparse.SUPPRESS,
                   help="one model, loaded at start; or several, each loaded on its first request (env "
                        "ORTLLM_ARTIFACT, or `artifact` in the config file)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="TOML file of serve options (keys: the flags' names; env ORTLLM_CONFIG)")
    p.add_argument("--print-config", action=Bool, default=False,
                   help="print every option's value and where it came from (flag, env, file, default), then exit")
    s = p.add_argument_group("sizing (the memory plan printed at start; a plan that does not fit is refused)")
    add_options(s, SIZING)
    add_options(p, ENGINE[len(SIZING):] + SERVICE)
    r = p.add_argument_group("scale-out on Ray Serve (pip install 'ortllm[ray]'; docs/service-scale-out.md)")
    add_options(r, RAY)
    p.set_defaults(run=run_serve, prepare=settings)


def settings(a, env=None) -> dict:
    """{dest: (value, source)} of every serve option, flag > env > file > default; sets them on `a` (and the dict
    as a.serve_values). Runs before store names are resolved (main: args.prepare), so a name from the env or a file
    is one too."""
    env = os.environ if env is None else env
    if getattr(a, "artifact", None) == []:
        del a.artifact
    path = a.config or (Path(env["ORTLLM_CONFIG"]) if env.get("ORTLLM_CONFIG") else None)
    data = read_toml(path) if path else {}
    per_model = data.pop("models", {})
    if not isinstance(per_model, dict) or not all(isinstance(v, dict) for v in per_model.values()):
        raise ConfigError(f"{path}: [models.\"NAME\"] tables size one model each; got models = {per_model!r}")
    if isinstance(data.get("artifact"), str):
        data["artifact"] = [data["artifact"]]
    out = layer(OPTIONS, a, env, data, str(path or ""))
    a.model_settings = {name: _model_overrides(table, f"{path}: models.{name}") for name, table in per_model.items()}
    if a.api_key_file is not None and out["api_key"][1] == "default":
        try:
            key = next(iter(a.api_key_file.read_text().splitlines()), "").strip()
        except OSError as e:
            raise ConfigError(f"--api-key-file {a.api_key_file}: cannot read it ({e.strerror})") from None
        if not key:
            raise ConfigError(f"--api-key-file {a.api_key_file} is empty; put the key on its first line")
        a.api_key = key
        out["api_key"] = (key, f"{out['api_key_file'][1]} (api_key_file)")
    if not a.artifact:
        raise ConfigError("ortllm serve needs a model: ortllm serve ARTIFACT|NAME (or ORTLLM_ARTIFACT, or "
                          "`artifact` in the --config file)")
    a.artifact_given = [str(p) for p in a.artifact]
    a.serve_values = out
    return out


def _model_overrides(table: dict, where: str) -> dict:
    by_key = {o.key: o for o in ENGINE}
    out = {}
    for key, value in table.items():
        k = key.replace("-", "_")
        if k not in by_key:
            raise ConfigError(f"{where}: unknown key {key!r}; a model's table takes {', '.join(sorted(by_key))}")
        out.update(engine_overrides({k: by_key[k].parse(value, f"{where}.{key}")}))
    return out


def engine_overrides(values: dict) -> dict:
    """Serve options -> EngineConfig keys (what the engine applies); None means the engine's own default."""
    out = {}
    for key, field in ENGINE_KEYS.items():
        v = values.get(key)
        if v is None:
            continue
        out[field] = _bytes(v) if key == "kv_cache_size" else v
    if "max_slots" in out:           # --max-loras also caps the adapters one step mixes (it cannot exceed the slots)
        from ortllm.runtime.config import SchedulerConfig
        out["max_adapters_per_batch"] = min(out["max_slots"], SchedulerConfig().max_adapters_per_batch)
    return out


def print_config(values: dict, out=None) -> None:
    out = sys.stdout if out is None else out     # the stream of the call, not the one of the import
    width = max(len(k) for k in values)
    for key, (value, source) in values.items():
        shown = "***" if key == "api_key" and value else format_value(value)
        if key == "artifact" and value:
            shown = " ".join(map(str, value))
        env = "" if key == "artifact" else f"  [{env_name(next(o for o in OPTIONS if o.key == key))}]"
        print(f"{key.ljust(width)}  {shown if shown is not None else '-'}  ({source}){env}", file=out)


def run_serve(a) -> int:
    values = a.serve_values
    if a.print_config:
        print_config(values)
        return 0
    try:
        return _serve(a, values)
    except ConfigError as e:
        raise ConfigError(annotate(str(e))) from None


def _serve(a, values: dict) -> int:
    from ortllm.service import logs
    from ortllm.service.server import serve

    from .store_verbs import served_models
    models = served_models(a)           # ((name, artifact dir), ...): store names as given, else recipe names
    config = service_config(a, values, models)
    logs.configure()
    if a.ray:
        from ortllm.service.ray_serve import serve_forever
        from ortllm.service.config import RayOptions
        if len(models) != 1:
            raise ConfigError("ortllm serve --ray: serve one model per Ray application")
        if values["threads"][1] != "default":
            raise ConfigError("ortllm serve --ray: give --threads-per-replica, not --threads")
        return serve_forever(config, RayOptions(address=a.address, replicas=a.replicas, min_replicas=a.min_replicas,
                                                max_replicas=a.max_replicas,
                                                threads_per_replica=a.threads_per_replica))
    return serve(config, names=plan_names())


def service_config(a, values: dict, models: tuple):
    """The ServiceConfig of resolved serve options (`settings`) for these served models ((name, dir), ...)."""
    from ortllm.service.config import ServiceConfig

    overrides = engine_overrides({k: v for k, (v, _) in values.items()})
    per_model = {}
    for key, own in a.model_settings.items():
        matches = [n for (n, p), given in zip(models, a.artifact_given) if key in (n, str(p), given, p.name)]
        if not matches:
            raise ConfigError(f"config file: [models.\"{key}\"] names no served model; served: "
                              f"{', '.join(n or str(p) for n, p in models)}")
        per_model[matches[0] or ""] = own
    if len(models) == 1 and per_model:
        overrides = {**overrides, **next(iter(per_model.values()))}
    return ServiceConfig(artifact=a.artifact[0] if len(models) == 1 else None, host=a.host, port=a.port,
                         api_key=a.api_key, model_name=a.model_name or (models[0][0] if len(models) == 1 else None),
                         http_threads=a.http_threads, request_timeout_s=a.request_timeout,
                         drain_timeout_s=a.drain_timeout, engine_overrides=overrides,
                         models=models if len(models) > 1 else (), keep_alive_s=a.keep_alive,
                         model_overrides=per_model if len(models) > 1 else {},
                         memory_budget_bytes=int(a.memory_budget * GIB) if a.memory_budget else None,
                         allowed_paths=tuple(a.allowed_path or ()), cors_origins=tuple(a.cors_origin or ()),
                         max_body_bytes=a.max_request_size, max_upload_bytes=a.max_upload_size)


def plan_names() -> dict[str, str]:
    """Config keys -> the serve flags that set them, for the memory plan's lines and messages."""
    names = flag_names(ENGINE)
    names["memory_budget_bytes"] = "--kv-cache-size"
    names["memory_budget"] = "--memory-budget"
    names["num_blocks"] = "--kv-cache-size"
    return names


def annotate(message: str) -> str:
    """A ConfigError's config keys followed by the serve flag that sets them: 'max_num_seqs (--parallel)'."""
    import re
    for key, flag in sorted(plan_names().items(), key=lambda kv: -len(kv[0])):
        message = re.sub(rf"\b{key}\b(?! \()", f"{key} ({flag})", message)
    return message
