"""KV pool sizing (runtime/memory_plan.py) from fake memory figures, and the lazily committed
CPU pool (runtime/kv_pool.py): no model is loaded."""

import sys
from pathlib import Path

import pytest
import torch

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.memory_plan import (
    GIB,
    AvailableMemory,
    cpu_available_memory,
    kv_bytes_per_token,
    module_bytes,
    plan_kv_pool,
)

# the default model (SmolLM2-135M) in bfloat16: 30 layers x 3 KV heads x 64 x 2 bytes x K and V
SMOL_BF16 = kv_bytes_per_token(30, 3, 64, torch.bfloat16)


def _plan(available_gib: float | None, **overrides):
    figures = {
        "bytes_per_token": SMOL_BF16,
        "page_size": 1,
        "context_length": 8192,
        "max_running_requests": 128,
        "mem_fraction_static": 0.85,
        "available": None
        if available_gib is None
        else AvailableMemory(int(available_gib * GIB), "test"),
        "weight_bytes": 100 * 2**20,
        **overrides,
    }
    return plan_kv_pool(**figures)


def test_bytes_per_token_counts_k_and_v_of_every_layer():
    assert SMOL_BF16 == 23040
    assert kv_bytes_per_token(32, 8, 128, torch.float32) == 2 * 32 * 8 * 128 * 4


def test_small_machine_memory_bound_subtracts_the_weights():
    plan = _plan(8.0)
    budget = int(0.85 * 8 * GIB) - 100 * 2**20
    assert plan.bound == "memory" and plan.tokens == budget // SMOL_BF16
    assert plan.tokens * SMOL_BF16 <= budget < (plan.tokens + 1) * SMOL_BF16
    assert "0.85 x 8.00 GiB available (test) - 0.10 GiB of weights" in plan.reason


def test_big_machine_needs_no_more_than_the_running_requests_contexts():
    plan = _plan(1024.0, max_running_requests=4, context_length=2048, page_size=16)
    assert plan.bound == "requests"
    assert plan.tokens == 4 * (2048 + 16)  # a context and a page per request
    assert plan.num_pages == 4 * (2048 // 16 + 1) + 1  # and the reserved page 0
    assert plan.gib == pytest.approx(plan.tokens * SMOL_BF16 / GIB)


def test_context_rounds_up_to_whole_pages():
    plan = _plan(1024.0, max_running_requests=2, context_length=100, page_size=16)
    assert plan.tokens == 2 * (7 + 1) * 16


def test_memory_bound_is_whole_pages():
    plan = _plan(1.0, page_size=16, max_running_requests=1024)
    assert plan.bound == "memory" and plan.tokens % 16 == 0


def test_max_total_tokens_overrides_both_bounds():
    plan = _plan(None, max_total_tokens=300)
    assert (plan.tokens, plan.bound) == (300, "max_total_tokens")
    assert plan.num_pages == 301


def test_one_context_that_cannot_fit_is_a_clear_error():
    # 0.85 x 0.2 GiB - 0.1 GiB leaves ~72 MiB: about 3,300 tokens, under one 8,192 context
    with pytest.raises(ValueError, match="cannot hold one request's context of 8192") as err:
        _plan(0.2)
    message = str(err.value)
    assert "mem_fraction_static" in message and "max_total_tokens" in message
    assert "lower context_length (to at most" in message


def test_weights_larger_than_the_budget_are_a_clear_error():
    with pytest.raises(ValueError, match=r"- 2\.00 GiB of weights = -0\.30 GiB"):
        _plan(2.0, weight_bytes=2 * GIB)


def test_available_memory_is_needed_without_max_total_tokens():
    with pytest.raises(ValueError, match="max_total_tokens"):
        _plan(None)


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_mem_fraction_static_out_of_range_is_rejected(fraction):
    with pytest.raises(ValueError, match="mem_fraction_static must be in"):
        EngineConfig(mem_fraction_static=fraction)


def test_kv_cache_gb_is_gone():
    with pytest.raises(ValueError, match="unknown engine option 'kv_cache_gb'"):
        EngineConfig.from_kwargs(kv_cache_gb=1.0)


# -- where the available figure comes from --------------------------------------------------
def _fake_proc(tmp_path: Path, available_kib: int | None) -> Path:
    meminfo = tmp_path / "meminfo"
    lines = ["MemTotal:       32000000 kB", "MemFree:        1000000 kB"]
    if available_kib is not None:
        lines.append(f"MemAvailable:   {available_kib} kB")
    meminfo.write_text("\n".join(lines) + "\n")
    return meminfo


def test_meminfo_available_without_cgroup_limit(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("123\n")
    got = cpu_available_memory(_fake_proc(tmp_path, 16_000_000), v2, tmp_path / "none")
    assert got == AvailableMemory(16_000_000 * 1024, "MemAvailable")


def test_cgroup_v2_limit_caps_the_host_figure(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{4 * GIB}\n")
    (v2 / "memory.current").write_text(f"{GIB}\n")
    (v2 / "memory.stat").write_text(f"anon 100\ninactive_file {GIB // 2}\nactive_file 7\n")
    got = cpu_available_memory(_fake_proc(tmp_path, 16_000_000), v2, tmp_path / "none")
    assert got.bytes == 4 * GIB - GIB + GIB // 2  # reclaimable page cache counts as room
    assert "cgroup limit 4.00 GiB" in got.source


def test_cgroup_v1_limit_and_its_no_limit_spelling(tmp_path):
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    meminfo = _fake_proc(tmp_path, 8_000_000)
    assert cpu_available_memory(meminfo, tmp_path / "none", v1).source == "MemAvailable"
    (v1 / "memory.limit_in_bytes").write_text(f"{3 * GIB}\n")
    assert cpu_available_memory(meminfo, tmp_path / "none", v1).bytes == 2 * GIB


def test_a_limit_above_the_host_figure_changes_nothing(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{64 * GIB}\n")
    (v2 / "memory.current").write_text("0\n")
    got = cpu_available_memory(_fake_proc(tmp_path, 1_000_000), v2, tmp_path / "none")
    assert got.source == "MemAvailable"


def test_physical_memory_where_meminfo_is_missing(tmp_path):
    got = cpu_available_memory(tmp_path / "no-meminfo", tmp_path / "a", tmp_path / "b")
    assert got.source == "physical memory" and got.bytes > 0


def test_module_bytes_counts_tied_weights_once():
    emb = torch.nn.Embedding(100, 8)
    head = torch.nn.Linear(8, 100, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleList([emb, head])
    model.register_buffer("cache", torch.zeros(10, dtype=torch.float16))
    assert module_bytes(model) == 100 * 8 * 4 + 10 * 2


# -- the pool's storage ---------------------------------------------------------------------
def _pool(num_pages: int | None, **overrides) -> KVPool:
    args = {
        "num_layers": 2,
        "page_size": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "dtype": torch.float32,
        "device": "cpu",
        "max_reqs": 3,
        "max_context": 16,
        "num_pages": num_pages,
        **overrides,
    }
    return KVPool(**args)


def test_pool_is_allocated_once_after_the_weights():
    pool = _pool(None)
    assert pool.k_buffers == [] and pool.capacity_pages == 0 and pool.alloc_pages(1) is None
    pool.allocate(5)
    assert pool.capacity_tokens == 16 and pool.alloc_pages(2) == [1, 2]
    assert all(b.shape == (20, 2, 8) and not b.any() for b in pool.k_buffers + pool.v_buffers)
    assert pool.bytes_per_token() == kv_bytes_per_token(2, 2, 8, torch.float32)
    with pytest.raises(RuntimeError, match="already allocated"):
        pool.allocate(5)
    with pytest.raises(ValueError, match="num_pages must be at least 2"):
        _pool(1)


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_cpu_pool_memory_is_taken_as_tokens_fill_it():
    before = _rss_bytes()
    # 2 layers x K,V x 2**20 tokens x 32 floats: a 512 MiB pool
    pool = _pool(2**18, num_kv_heads=4, head_dim=8)
    assert _rss_bytes() - before < 64 * 2**20
    slots = pool.slots_of_pages(pool.alloc_pages(1024))
    for buf in pool.k_buffers:
        buf.index_copy_(0, slots, torch.ones(len(slots), 4, 8))
    assert float(pool.k_buffers[1][slots].sum()) == len(slots) * 32
    assert _rss_bytes() - before < 64 * 2**20  # 4,096 tokens written: ~1 MiB taken
