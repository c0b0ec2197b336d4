"""The build as the CLI runs it: ortllm.pipeline's build with the in-build quality check composed in.

The check (ortllm.calibration.quality) runs the engine, which the pipeline may not import (docs/architecture.md,
Dependency rules; tests/test_layering.py), so it is joined here, above both."""
from __future__ import annotations


def build_artifact(spec: str, out, opts, **kwargs) -> dict:
    """ortllm.pipeline.build.build(spec, out, opts, **kwargs) with quality_check=in_build_quality."""
    from ortllm.calibration.quality import in_build_quality
    from ortllm.pipeline.build import build

    return build(spec, out, opts, quality_check=in_build_quality, **kwargs)
