"""How many tokens the KV pool holds: SGLang's `mem_fraction_static` rule, capped by need.

    weights + KV pool <= mem_fraction_static x memory available at start
    KV pool           <= max_running_requests x (context_length + one page)
    max_total_tokens, when set, is the size: neither bound applies

"Available" is free GPU memory on CUDA; on the CPU, the physical memory the OS can hand out
without swapping (Linux MemAvailable), capped by the process's cgroup limit, or the machine's
physical memory where the OS reports nothing better (macOS).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

GIB = 2**30
_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1 = Path("/sys/fs/cgroup/memory")
_NO_LIMIT = 1 << 60  # cgroup v1 spells "no limit" as a number near 2**63


@dataclass(frozen=True)
class AvailableMemory:
    bytes: int
    source: str  # where the figure came from, for the log line and errors


@dataclass(frozen=True)
class KVPlan:
    """The pool's size in tokens and which bound chose it (for the startup log)."""

    tokens: int
    page_size: int
    bytes_per_token: int
    bound: str  # "max_total_tokens", "memory" or "requests"
    reason: str

    @property
    def num_pages(self) -> int:
        return self.tokens // self.page_size + 1  # page 0 is reserved for padding writes

    @property
    def gib(self) -> float:
        return self.tokens * self.bytes_per_token / GIB


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K and V of one token in every layer."""
    return 2 * layers * kv_heads * head_dim * dtype.itemsize


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each storage once (tied weights share one)."""
    storages = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def plan_kv_pool(
    *,
    bytes_per_token: int,
    page_size: int,
    context_length: int,
    max_running_requests: int,
    mem_fraction_static: float,
    available: AvailableMemory | None,
    weight_bytes: int,
    max_total_tokens: int | None = None,
) -> KVPlan:
    """The pool for these figures; `available` may be None only with `max_total_tokens`.

    Raises ValueError when the memory bound cannot hold one request's whole context."""
    pages_per_request = math.ceil(context_length / page_size) + 1
    need = max_running_requests * pages_per_request * page_size
    if max_total_tokens is not None:
        return KVPlan(
            max_total_tokens,
            page_size,
            bytes_per_token,
            "max_total_tokens",
            f"max_total_tokens={max_total_tokens} (the most {max_running_requests} requests of "
            f"{context_length} tokens could use: {need})",
        )
    if available is None:
        raise ValueError("the KV pool needs the available memory or max_total_tokens")
    budget = int(mem_fraction_static * available.bytes) - weight_bytes
    fits = max(budget, 0) // bytes_per_token // page_size * page_size
    memory = (
        f"mem_fraction_static {mem_fraction_static} x {available.bytes / GIB:.2f} GiB available "
        f"({available.source}) - {weight_bytes / GIB:.2f} GiB of weights = "
        f"{budget / GIB:.2f} GiB, {fits} tokens"
    )
    one_request = pages_per_request * page_size
    if fits < one_request:
        most = max(fits - page_size, 0)
        raise ValueError(
            f"the KV pool cannot hold one request's context of {context_length} tokens "
            f"({one_request * bytes_per_token / GIB:.2f} GiB): {memory}. Raise "
            f"mem_fraction_static, lower context_length (to at most {most}), or set "
            "max_total_tokens to accept requests shorter than the model's context"
        )
    if need <= fits:
        reason = (
            f"max_running_requests {max_running_requests} x (context {context_length} + a "
            f"page) = {need} tokens, all the pool can use (memory allows {fits}: {memory})"
        )
        return KVPlan(need, page_size, bytes_per_token, "requests", reason)
    reason = (
        f"memory: {memory} (under the {need} tokens {max_running_requests} requests of "
        f"{context_length} could use)"
    )
    return KVPlan(fits, page_size, bytes_per_token, "memory", reason)


def available_memory(device: torch.device) -> AvailableMemory:
    """Memory the process can still take on `device` (see the module docstring)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return AvailableMemory(int(free), "free CUDA memory")
    if device.type != "cpu":
        raise ValueError(
            f"the memory available on a {device.type} device is unknown: set max_total_tokens"
        )
    return cpu_available_memory(Path("/proc/meminfo"), _CGROUP_V2, _CGROUP_V1)


def cpu_available_memory(meminfo: Path, cgroup_v2: Path, cgroup_v1: Path) -> AvailableMemory:
    """MemAvailable (else physical memory) capped by a cgroup v2 or v1 memory limit; the
    paths are parameters so tests can feed fake figures."""
    figure = _meminfo_available(meminfo)
    if figure is None:
        if not hasattr(os, "sysconf"):  # Windows
            raise ValueError("the available RAM is unknown on this OS: set max_total_tokens")
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        figure = AvailableMemory(pages * page_size, "physical memory")
    room = _cgroup_room(cgroup_v2, "memory.max", "memory.current") or _cgroup_room(
        cgroup_v1, "memory.limit_in_bytes", "memory.usage_in_bytes"
    )
    if room is not None and room.bytes < figure.bytes:
        return room
    return figure


def _meminfo_available(path: Path) -> AvailableMemory | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return AvailableMemory(int(line.split()[1]) * 1024, "MemAvailable")
    return None


def _cgroup_room(folder: Path, limit_file: str, usage_file: str) -> AvailableMemory | None:
    """The cgroup's limit minus its usage (reclaimable page cache counts as free), or None
    without a limit."""
    try:
        limit_text = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    if limit_text == "max" or int(limit_text) >= _NO_LIMIT:
        return None
    limit = int(limit_text)
    return AvailableMemory(
        max(limit - usage + _inactive_file(folder), 0),
        f"cgroup limit {limit / GIB:.2f} GiB ({folder / limit_file})",
    )


def _inactive_file(folder: Path) -> int:
    try:
        stat = (folder / "memory.stat").read_text().split()
    except OSError:
        return 0
    fields = dict(zip(stat[::2], stat[1::2], strict=False))
    return int(fields.get("inactive_file", fields.get("total_inactive_file", 0)))
