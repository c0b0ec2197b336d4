import dataclasses

import pytest

from ortllm.runtime.config import (AdapterConfig, CacheConfig, EngineConfig, SchedulerConfig,
                                   physical_cores)
from ortllm.runtime.errors import ConfigError


def test_defaults():
    cfg = EngineConfig(artifact="a")
    assert cfg.scheduler.max_batch_tokens == 512 and cfg.scheduler.max_num_seqs == 32
    assert cfg.scheduler.prefill_chunk == 512
    assert cfg.cache.block_size == 16 and cfg.cache.enable_prefix_cache
    assert cfg.adapters.max_slots == 16 and cfg.adapters.max_rank == 64
    assert cfg.threads == physical_cores() >= 1
    assert str(cfg.artifact) == "a"


def test_overrides_route_to_sub_configs():
    cfg = EngineConfig.from_overrides("art", max_batch_tokens=64, num_blocks=40, kv_dtype="int8",
                                      max_slots=2, max_adapters_per_batch=2, threads=3, seed=7)
    assert cfg.scheduler.max_batch_tokens == 64 and cfg.scheduler.max_adapters_per_batch == 2
    assert cfg.cache.num_blocks == 40 and cfg.cache.kv_dtype == "int8"
    assert cfg.adapters.max_slots == 2 and cfg.threads == 3 and cfg.seed == 7


def test_overrides_on_top_of_sub_config():
    cfg = EngineConfig.from_overrides("art", cache=CacheConfig(block_size=32), num_blocks=9)
    assert cfg.cache.block_size == 32 and cfg.cache.num_blocks == 9


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="max_batch_tokens") as e:
        EngineConfig.from_overrides("art", max_batch_token=64)
    assert "did you mean 'max_batch_tokens'" in str(e.value) and "num_blocks" in str(e.value)


def test_kv_dtype_aliases_and_check():
    assert CacheConfig(kv_dtype="fp8").kv_dtype == "fp8_e4m3"
    assert CacheConfig(kv_dtype="fp32").kv_dtype == "float32"
    assert CacheConfig(kv_dtype="int4").kv_dtype == "int4"
    assert CacheConfig(kv_dtype="fp16").kv_dtype == "float16"
    with pytest.raises(ConfigError,
                       match="kv_dtype must be one of float32, float16, int8, fp8_e4m3, int4; got 'int2'"):
        CacheConfig(kv_dtype="int2")


def test_kv_block_bytes():
    """int4 rows are two codes a byte plus their fp16 scale: 64 dims -> 34 bytes a row, against 66 at int8; float16
    rows are the values at 2 bytes, no scale: 128, half of float32's 256."""
    cfg = CacheConfig(block_size=16)
    assert cfg.bytes_per_block(30, 3, 64, "int4") == 2 * 30 * 16 * 3 * 34
    assert cfg.bytes_per_block(30, 3, 64, "int8") == 2 * 30 * 16 * 3 * 66
    assert cfg.bytes_per_block(30, 3, 64, "float16") == 2 * 30 * 16 * 3 * 128
    assert cfg.bytes_per_block(30, 3, 64, "float32") == 2 * 30 * 16 * 3 * 256


@pytest.mark.parametrize("kwargs, msg", [
    (dict(max_batch_tokens=8, max_num_seqs=4), r"max_batch_tokens must be >= block_size \(16\); got 8"),
    (dict(max_adapters_per_batch=17), r"max_adapters_per_batch \(17\) must be <= max_slots \(16\)"),
    (dict(threads=0), "threads must be a positive integer"),
    (dict(max_num_seqs=0), "max_num_seqs must be a positive integer; got 0"),
    (dict(max_num_seqs=600), r"max_num_seqs \(600\) must be <= max_batch_tokens \(512\)"),
    (dict(long_prefill_chunk=1000), r"long_prefill_chunk must be <= max_batch_tokens \(512\); got 1000"),
    (dict(block_size=12), "block_size must be a power of two"),
    (dict(num_blocks=1), "num_blocks must be >= 2"),
    (dict(num_blocks=10, memory_budget_bytes=100), "set num_blocks or memory_budget_bytes, not both"),
    (dict(max_rank=0), "max_rank must be a positive integer"),
    (dict(enable_prefix_cache="yes"), "enable_prefix_cache must be True or False"),
    (dict(max_queued=True), "max_queued must be a positive integer"),
    (dict(decode_steps=0), "decode_steps must be a positive integer; got 0"),
])
def test_validation_messages(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        EngineConfig.from_overrides("art", **kwargs)


def test_config_error_is_value_error_and_replace_revalidates():
    cfg = SchedulerConfig()
    with pytest.raises(ValueError):
        dataclasses.replace(cfg, max_batch_tokens=0)
    assert dataclasses.replace(cfg, max_batch_tokens=64, max_num_seqs=8).prefill_chunk == 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_batch_tokens = 3


def test_num_blocks_from_budget():
    c = CacheConfig(memory_budget_bytes=10_000_000, kv_dtype="int8")
    per = c.bytes_per_block(num_layers=30, num_kv_heads=3, head_dim=64)
    assert per == 2 * 30 * 16 * 3 * (64 + 2)          # int8 codes + one fp16 scale per (token, head)
    assert c.resolve_num_blocks(per) == 10_000_000 // per
    assert CacheConfig(num_blocks=12).resolve_num_blocks(per) == 12
    assert CacheConfig().bytes_per_block(1, 1, 64) == 2 * 16 * 64 * 4
    with pytest.raises(ConfigError, match="raise memory_budget_bytes"):
        CacheConfig(memory_budget_bytes=100).resolve_num_blocks(per)


def test_adapter_config():
    assert AdapterConfig(host_budget_bytes=1).host_budget_bytes == 1
