"""The build as the CLI runs it: ortllm.pipeline's build with the in-build quality check composed in.

The check (ortllm.calibration.quality) runs the engine, which the pipeline may not import (docs/architecture.md,
Dependency rules; tests/test_layering.py), so it is joined here, above both. A hub spec (hf.co/ORG/REPO[:QUANT],
a URL) is downloaded first (pipeline/hub.py), as `ortllm pull` does it."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


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
