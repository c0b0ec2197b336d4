"""setuptools hook: a (non-editable) `pip install .` builds libortllm_ops.so into the installed package.

Editable installs (`make setup`) leave it to `make ops`, which builds into runtime/lib/ in place.
"""
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for the platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


class BuildPyWithOps(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        out = Path(self.build_lib) / "ortllm" / "runtime" / "lib"
        root = Path(__file__).resolve().parent
        subprocess.run(["bash", str(root / "ci" / "build_ops.sh"), "--out", str(out)], check=True)


setup(cmdclass={"build_py": BuildPyWithOps}, distclass=BinaryDistribution)
