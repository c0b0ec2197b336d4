"""`ortllm build`: its parser, and the build as the CLI runs it: ortllm.pipeline's build with the in-build
quality check composed in.

The check (ortllm.calibration.quality) runs the engine, which the pipeline may not import (docs/architecture.md,
Dependency rules; tests/test_layering.py), so it is joined here, above both. A hub spec (hf.co/ORG/REPO[:QUANT],
a URL) is downloaded first (pipeline/hub.py), as `ortllm pull` does it."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .build_options import add_build_options, build_options
from .options import Option, add_options, fill_defaults

BUILD_VERB_OPTIONS = (
    Option("--force", "replace whatever --out holds", default=False),
    Option("--fp32-reference", "how the build runs the model in fp32 for its calibration pass and its quality "
           "check's reference: whole (full), or one layer at a time in bounded memory (layers); auto: layers where the "
           "model's fp32 copy would not fit. full|layers also measure a shape recipe's random weights, which auto "
           "skips", default="auto",
           choices=lambda: __import__("ortllm.pipeline.build", fromlist=["x"]).FP32_REFERENCES),
)


def add_build(sub) -> None:
    p = sub.add_parser("build", help="build an artifact from a recipe, a GGUF file or a HF directory (or a model "
                                     "downloaded from a Hugging Face hub)")
    p.add_argument("model", metavar="RECIPE|PATH|hf.co/ORG/REPO[:QUANT|:FILE]")
    p.add_argument("--out", required=True, type=Path, help="artifact directory to write")
    add_build_options(p)
    add_options(p, BUILD_VERB_OPTIONS)
    p.set_defaults(run=run_build)


def run_build(a) -> int:
    opts = build_options(a)
    fill_defaults(a, BUILD_VERB_OPTIONS)
    build_artifact(a.model, a.out, opts, source=a.source, force=a.force, fp32_reference=a.fp32_reference,
                   log=lambda m: print(m, file=sys.stderr))
    return 0


def build_artifact(spec: str, out, opts, **kwargs) -> dict:
    """ortllm.pipeline.build.build(spec, out, opts, **kwargs) with quality_check=in_build_quality."""
    from ortllm.calibration.quality import in_build_quality
    from ortllm.pipeline.build import build

    if Path(spec).exists():
        return build(spec, out, opts, quality_check=in_build_quality, **kwargs)
    from ortllm.pipeline.hub import download, missing_path_hint, parse_spec, resolve
    from ortllm.runtime.hash_cache import ortllm_home

    hub = parse_spec(spec)
    if hub is None:
        if (hint := missing_path_hint(spec)) is not None:
            raise hint
        return build(spec, out, opts, quality_check=in_build_quality, **kwargs)
    log = kwargs.get("log", print)
    stage = Path(out).absolute().parent / f".{Path(out).name}.hub-{os.getpid()}"    # a safetensors repo's links
    try:
        plan = resolve(hub, ortllm_home() / "downloads", sys.stderr.isatty(), log)
        return build(str(download(plan, stage, log)), out, opts, quality_check=in_build_quality, **kwargs)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
