"""The ops library: found in the package, loads in the installed onnxruntime, refuses missing or stale
builds with a one-line message naming the build command, exports only what it should."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from ortllm.runtime import ops_library
from ortllm.runtime.ops_library import (OPS_ABI_VERSION, OpsLibraryError, check_ops_library, ops_isas, register_ops,
                                        sessions_isa)
from ortllm.bench.op_graphs import multi_lora_model, paged_attention_model, session
from tests.custom_ops.conftest import REPO, sessions_on


def test_default_path_is_inside_the_package(monkeypatch):
    monkeypatch.delenv("ORTLLM_OPS_LIBRARY", raising=False)
    assert ops_library.ops_library_path() == Path(ops_library.__file__).parent / "lib" / "libortllm_ops.so"


def test_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("ORTLLM_OPS_LIBRARY", str(tmp_path / "x.so"))
    assert ops_library.ops_library_path() == tmp_path / "x.so"


def test_missing_library_names_the_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("ORTLLM_OPS_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(OpsLibraryError, match=r"not found at .*nope\.so; build it with `make ops`"):
        register_ops(ort.SessionOptions())


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_stale_library_is_refused(tmp_path):
    src = tmp_path / "stale.c"
    src.write_text(f"int OrtllmOpsAbiVersion(void) {{ return {OPS_ABI_VERSION + 41}; }}\n")
    so = tmp_path / "libstale.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(OpsLibraryError, match=rf"ops ABI version {OPS_ABI_VERSION + 41}, this ortllm needs "
                                              rf"{OPS_ABI_VERSION}; rebuild it with `make ops`"):
        check_ops_library(so)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_library_without_its_tables_is_refused(tmp_path):
    """A library of this ABI version built before the ops exported their tables: reading one names the rebuild."""
    src = tmp_path / "untabled.c"
    src.write_text(f"int OrtllmOpsAbiVersion(void) {{ return {OPS_ABI_VERSION}; }}\n")
    so = tmp_path / "libuntabled.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(OpsLibraryError, match=r"does not export its ops' tables .*; rebuild it with `make ops`"):
        ops_library.op_schema("QLinear", so)

def test_library_abi_matches_and_loads_in_installed_onnxruntime():
    path = check_ops_library()
    assert ops_library.ops_abi_version(path) == OPS_ABI_VERSION
    # both ops (and both cache types of PagedAttention) resolve in a real session
    session(paged_attention_model(num_heads=9, kv_num_heads=3, head_size=64, block_size=16))
    session(paged_attention_model(num_heads=9, kv_num_heads=3, head_size=64, block_size=16, kv_dtype="fp8_e4m3"))
    session(multi_lora_model())
    assert tuple(int(x) for x in ort.__version__.split(".")[:2]) >= (1, 21)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils")
def test_not_linked_to_onnxruntime_and_exports_only_entry_points():
    path = check_ops_library()
    dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    assert "onnxruntime" not in dyn
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True, text=True,
                          check=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines()
                if " FUNC " in line and " GLOBAL " in line and " UND " not in line}
    assert {"RegisterCustomOps", "OrtllmOpsAbiVersion"} <= exported
    assert exported <= {"RegisterCustomOps", "OrtllmOpsAbiVersion", "OrtllmOpsIsa", "OrtllmOpsIsas", "OrtllmOpsSchema",
                        "OrtllmOpsPrefetch"}, exported


def test_stream_prefetch_hint_follows_the_cpu_vendor_unless_forced():
    """T0 on Intel, NTA elsewhere (custom_ops/src/kernels/stream_prefetch.h); ORTLLM_OPS_PREFETCH forces either, and
    an unknown value keeps the vendor's choice."""
    vendor = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("vendor_id")), "")
    auto = "t0" if vendor == "GenuineIntel" else "nta"
    code = "from ortllm.runtime.ops_library import ops_prefetch; print(ops_prefetch())"
    for forced, want in ((None, auto), ("t0", "t0"), ("nta", "nta"), ("fast", auto)):
        env = {k: v for k, v in os.environ.items() if k != "ORTLLM_OPS_PREFETCH"}
        env |= {"ORTLLM_OPS_PREFETCH": forced} if forced else {}
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
        assert out.stdout.strip() == want, (forced, out.stderr)


def test_ops_library_module_never_imports_torch():
    code = "import sys, ortllm.runtime.ops_library; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_scalar_fallback_path_passes_parity():
    """The portable scalar path is offered on every CPU (last in ops_isas()) and passes a parity subset against the
    NumPy references, its sessions beside the default path's in this one process (conftest ops_path)."""
    from tests.custom_ops import test_multi_lora as ml
    from tests.custom_ops import test_paged_attention as pa
    assert ops_isas()[-1] == "scalar", ops_isas()
    with sessions_on("scalar"):
        pa.test_paged_attention_fp32_parity((9, 3), 16, "mixed")
        for bs in (16, 32):
            pa.test_paged_attention_fp16_parity((9, 3), bs, "mixed")
        for kv_dtype in ("int8", "fp8_e4m3", "int4"):
            pa.test_paged_attention_8bit_parity((9, 3), 16, "mixed", kv_dtype)
        for name in sorted(pa.LONG_CASES):
            for bs in (16, 32):
                pa.test_paged_attention_fp32_long_context(name, bs)
        for name in ("single", "batch_of_8"):
            pa.test_paged_attention_fp16_long_context(name)
        for name in ("single", "long_chunk", "batch_of_8"):
            for kv_dtype in ("int8", "int4"):
                pa.test_paged_attention_integer_long_context(name, kv_dtype)
        sess = ml._session(False, sessions_isa())
        ml.test_multi_lora_parity(sess, 16, 4, (8, 16, 32, 64))
        ml.test_multi_lora_fused_qkv_shapes(sess)
        ml.test_multi_lora_output_aliases_base_y_under_io_binding(sess)


def test_a_session_takes_any_offered_path_and_refuses_others():
    """register_ops(isa=...) gives a session the named path (one process holds sessions on several), and refuses a
    name this CPU does not offer, saying which it does."""
    for path in ops_isas():
        session(multi_lora_model(), isa=path)
    with pytest.raises(OpsLibraryError, match=r"ops_isa 'sse9' is not a kernel path of this CPU and build; choose "
                                              r"one of .*scalar"):
        session(multi_lora_model(), isa="sse9")
