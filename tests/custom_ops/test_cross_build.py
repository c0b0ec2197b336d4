"""The ops library is portable: x86 code lives only under custom_ops/src/kernels/x86/ (its tables, CPU checks and
intrinsics), and the rest, with the scalar path alone (kernels/isa_generic.cc), builds for aarch64 with Debian's cross
compiler (ci/cross_build_aarch64.sh)."""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.custom_ops.conftest import REPO

SRC = REPO / "custom_ops" / "src"
X86_ONLY = re.compile(r"immintrin|[xep]mmintrin|\b_mm(256|512)?_|__m(128|256|512)|__builtin_cpu_|__get_cpuid|"
                      r"#pragma GCC target|arch_prctl")
EM_AARCH64 = 183   # ELF e_machine


def test_x86_code_lives_only_in_x86_files():
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
             for p in sorted(SRC.rglob("*")) if p.suffix in (".h", ".cc") and "x86" not in p.relative_to(SRC).parts
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if X86_ONLY.search(line.split("//")[0])]
    assert not found, "x86-only code outside custom_ops/src/kernels/x86/:\n" + "\n".join(found)


def test_planted_x86_line_is_found():
    """The scan above sees what it looks for (a line of qlinear_avx2.cc would fail it)."""
    line = (SRC / "kernels" / "x86" / "vec_avx2.cc").read_text()
    assert X86_ONLY.search(line)


def test_the_scalar_path_builds_for_aarch64(tmp_path):
    res = subprocess.run(["bash", str(REPO / "ci" / "cross_build_aarch64.sh"), str(tmp_path / "build")],
                         capture_output=True, text=True, timeout=900)
    if res.returncode == 3:
        pytest.skip(res.stderr.strip())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    lib = tmp_path / "build" / "libortllm_ops.so"
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == EM_AARCH64, head
