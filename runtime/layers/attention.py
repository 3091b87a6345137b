"""Attention: the backend is chosen once per engine; it also owns writing new K/V to the pool.

torch    attention/sdpa_backend.py TorchPagedBackend (SDPA, the C++ decode kernel on CPUs
         that build it, cascade decoding); K/V stored with index_copy_
triton   attention/triton_backend.py (decode and extend kernels, kernels/store_kv.py)
"""

from __future__ import annotations

import torch

from radixflow.runtime.attention.base import AttentionBackend
from radixflow.runtime.attention.sdpa_backend import TorchPagedBackend
from radixflow.runtime.kv_pool import KVPool


def choose_attention_backend(
    name: str, pool: KVPool, device: torch.device
) -> tuple[str, AttentionBackend]:
    """(resolved name, backend) for the `attention_backend` knob (EngineConfig validates it):
    "auto" is triton on CUDA and torch elsewhere."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "triton":
        from radixflow.runtime.attention.triton_backend import TritonBackend

        return name, TritonBackend(pool)
    return name, TorchPagedBackend(pool)
