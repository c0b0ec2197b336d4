"""The build options of `ortllm build` and `ortllm pull`, each from the `BuildOptions` field it sets
(ortllm.pipeline.build): choices from the pipeline's tables, defaults from the dataclass or, where the build derives
one from other options, from the same table the build reads (DEFAULT_LM_HEAD, DEFAULT_KV, ...)."""
from __future__ import annotations

from .options import Option, add_options, declares, fill_defaults


def _opts():
    from ortllm.pipeline.build import BuildOptions
    return BuildOptions


def _build():
    import ortllm.pipeline.build as build
    return build


def _per_quant(table: dict, tail: str = "") -> str:
    """{quant: value} -> 'int8 for --quant int8|int4, fp32 for --quant fp32' (grouped by value)."""
    by_value: dict[str, list[str]] = {}
    for quant, value in table.items():
        by_value.setdefault(value, []).append(quant)
    return ", ".join(f"{v} for --quant {'|'.join(qs)}" for v, qs in by_value.items()) + tail


def _lm_head_default() -> str:
    return _per_quant(_build().DEFAULT_LM_HEAD)


def _kv_default() -> str:
    return "the recipe's, else " + _per_quant(_build().DEFAULT_KV, " on the engine graph; fp32 on the portable one")


def _head_algo_default() -> str:
    from ortllm.pipeline.quantize import DEFAULT_HEAD_ALGO
    return f"{DEFAULT_HEAD_ALGO}, from the final norm's output with a searched grid; it needs --calib-tokens > 0"


def _recipe_or(field: str):
    return lambda: f"the recipe's, else {_opts()().__getattribute__(field)}"


BUILD_OPTIONS = (
    Option("--source", "weights for recipes that take a local path (e.g. tinyllama-1.1b-chat)", default=None),
    Option("--quant", "weight quantization", _opts, choices=lambda: _build().QUANTS,
           default_text=_recipe_or("quant")),
    Option("--block-size", "quantization block size, a power of two >= 16: 16|32|64|128|256", _opts,
           default_text=_recipe_or("block_size"), metavar="N"),
    Option("--algo", "weight quantizer (gptq: error feedback from calibration activations of the fp32 model)", _opts,
           choices=lambda: tuple(_build().ALGOS)),
    Option("--calib-tokens", "calibration tokens for --algo gptq and --smooth (windows of 256)", _opts, metavar="N"),
    Option("--smooth", "SmoothQuant migration strength in [0, 1] for the projections after a norm (q|k|v, gate|up); "
           "0: off", _opts, metavar="ALPHA",
           default_text="0.5 for --quant int8 with int8 compute (--accuracy-level 4) and --algo rtn|hqq, "
                        "and for Gemma 3's --quant int4 without gptq; else off"),
    Option("--smooth-down", "SmoothQuant migration strength in [0, 1] for down_proj's input, carried by up_proj's "
           "rows (GLU MLPs)", _opts, metavar="ALPHA"),
    Option("--act16", "projection groups whose int8 weights take int16 activation codes: a comma-separated list of "
           "qkv, o, gate_up, down, or none", _opts, type=str, metavar="GROUPS",
           default_text="the family's; Gemma 3 measured in docs/quality-gemma3.md"),
    Option("--source-mix", "--quant int4 on a GGUF: keep its tensors of types wider than 4 bits (Q5_0, Q6_K, Q8_0, "
           "...) int8 (on) or round them to int4 too (off); Q4_K tensors keep their own grid", _opts,
           takes_value=True),
    Option("--symmetric", "symmetric int8/int4 (no zero points)", _opts),
    Option("--accuracy-level", "MatMulNBits accuracy_level (4: int8 compute)", _opts, choices=(0, 1, 2, 3, 4)),
    Option("--lm-head", "LM head quantization", _opts, choices=lambda: _build().QUANTS,
           default_text=_lm_head_default),
    Option("--lm-head-algo", "the quantizer of an int4 LM head", _opts, choices=lambda: tuple(_build().ALGOS),
           default_text=_head_algo_default),
    Option("--keep", "keep HF tensors matching the glob wider, e.g. 'model.layers.*.mlp.down_proj.weight=int8' "
           "(repeatable; first match wins)", _opts, type=str, repeat=True, metavar="PATTERN=fp32|int8"),
    Option("--kv", "KV cache dtype (fp16 halves fp32's bytes at no measurable quality cost; int8 and int4 cost "
           "quality on held-out text: docs/quality.md)", _opts, choices=lambda: _build().KV_DTYPES,
           default_text=_kv_default),
    Option("--kv-block-size", "tokens per paged KV block (engine graph)", _opts,
           choices=lambda: _build().KV_BLOCK_SIZES),
    Option("--kv-rotate", "Hadamard-rotate keys (int4: and values) before a quantized KV cache (off: for "
           "comparison)", _opts, takes_value=True),
    Option("--graph", "engine (paged KV, multi-LoRA; needs the ops library) | portable (stock ONNX Runtime)", _opts,
           choices=lambda: __import__("ortllm.runtime.contract", fromlist=["x"]).GRAPH_KINDS),
    Option("--exporter", "optimum also writes optimum/", _opts, choices=lambda: _build().EXPORTERS),
)


def build_options(a):
    """The BuildOptions of parsed `build` / `pull` arguments: the recipe's defaults where it has them."""
    from ortllm.pipeline.build import BuildOptions
    from ortllm.pipeline.recipes import known_recipes

    recipe = known_recipes()[a.model].build if a.model in known_recipes() else {}
    given = {k: getattr(a, k) for k in ("quant", "block_size", "kv") if hasattr(a, k)}   # else the recipe's
    fill_defaults(a, BUILD_OPTIONS)
    d = BuildOptions()
    return BuildOptions(
        quant=given.get("quant") or recipe.get("quant", d.quant),
        block_size=given.get("block_size") or recipe.get("block_size", d.block_size),
        algo=a.algo, lm_head=a.lm_head, lm_head_algo=a.lm_head_algo, kv=given.get("kv") or recipe.get("kv"),
        graph=a.graph, exporter=a.exporter, kv_block_size=a.kv_block_size, symmetric=a.symmetric,
        accuracy_level=a.accuracy_level, keep=tuple(a.keep), kv_rotate=bool(a.kv_rotate),
        calib_tokens=a.calib_tokens, smooth=a.smooth, smooth_down=a.smooth_down, source_mix=bool(a.source_mix),
        act16=None if a.act16 is None else tuple(g for g in a.act16.split(",") if g and g != "none"))


def add_build_options(p) -> None:
    """The build options on `ortllm build`'s or `ortllm pull`'s parser (declared only when one of them is parsed)."""
    if declares("build", "pull"):
        add_options(p, BUILD_OPTIONS)
